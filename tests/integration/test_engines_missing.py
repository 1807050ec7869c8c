"""Without the onnx extra (onnxruntime and onnx not installed), with the real model and database:
an engine asked for is one line saying what to install, `auto` skips the engines, and a model a
catalog gives an engine encodes in torch fp32."""

from __future__ import annotations

import logging
import sys
from dataclasses import replace

import numpy as np
import psycopg
import pytest

from helpers import cli
from pgembed.encode import embedder, engines, precision

MINILM = embedder.Settings("all-MiniLM-L6-v2")
INSTALL = "pip install 'pgembed[onnx]'"


@pytest.fixture
def without_onnx(monkeypatch: pytest.MonkeyPatch) -> None:
    """`import onnxruntime` and `import onnx` fail, as where the extra is not installed."""
    for name in ("onnxruntime", "onnx"):
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(ImportError):
        import onnxruntime  # noqa: F401


@pytest.mark.usefixtures("without_onnx")
def test_an_engine_asked_for_is_one_line_saying_what_to_install(
    reviews: psycopg.Connection, db_url: str
) -> None:
    assert engines.missing() == "onnxruntime and onnx are not installed"
    for engine in engines.VARIANTS:
        add = ("model", "add", "minilm", "--table", "reviews", "--column", "body")
        result = cli("--database-url", db_url, *add, "--precision", engine)
        # after the model's load (its progress line), before anything is registered
        assert (result.exit_code, result.stderr.splitlines()[-1]) == (
            2,
            f"pgembed: error: precision {engine} is an onnx engine, but onnxruntime and onnx "
            f"are not installed: {INSTALL}",
        )
        assert "Traceback" not in result.stderr and result.stdout == ""
    # nothing was registered: the same `model add` with auto works, and skips the engines
    done = cli("--database-url", db_url, *add, "--precision", "auto")
    assert done.exit_code == 0, done.output
    ((chosen, note),) = reviews.execute("SELECT precision, precision_note FROM pgembed.models")
    assert chosen in ("bf16", "fp32") and "unavailable" not in note, note  # no engine tried


@pytest.mark.usefixtures("without_onnx")
def test_auto_tries_no_engine_and_says_so_when_it_ends_at_fp32() -> None:
    order, why = precision.auto_candidates("cpu")
    assert not any(engines.is_engine(name) for name in order) and order[-1] == "fp32"
    assert why.endswith(", no onnx engines)")


@pytest.mark.usefixtures("without_onnx")
def test_a_catalogs_engine_encodes_in_torch_fp32_saying_what_to_install(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A model given an engine where the extra was installed, read by a worker where it is not."""
    settings = replace(MINILM, precision="onnx-int8-token", max_seq_length=120)  # not loaded yet
    with caplog.at_level(logging.INFO, logger="pgembed.encode"):
        fallback = embedder.get(settings)
    assert fallback.engine == "fp32"
    (line,) = [r.getMessage() for r in caplog.records if r.name == "pgembed.encode"]
    assert line == (
        "engine onnx-int8-token unavailable (onnxruntime and onnx are not installed: "
        f"{INSTALL}): encoding with torch fp32"
    )
    texts = precision.builtin_sample()[:8]
    want = embedder.get(replace(settings, precision="fp32")).encode_documents(texts)
    np.testing.assert_array_equal(fallback.encode_documents(texts), want)
