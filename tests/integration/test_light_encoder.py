"""The light encoder of a cold `pgembed query` (encode/light.py) gives the very vectors of the
sentence-transformers path, in every precision, pooling and setting it accepts; anything else
falls back to the full path."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from pgembed.encode import embedder, light

TEXTS = [
    "battery dies fast",
    "Ünïcödé àccents, 中文字符 and an emoji 🎉",
    "  spaced   out\tand\nsplit  ",
    "x",
    "word " * 400,  # truncated at max_seq_length
    "The charger gets very hot and stopped working after a week.",
]

CASES = [
    embedder.Settings("all-MiniLM-L6-v2", pooling="mean", max_seq_length=256, precision="fp32"),
    embedder.Settings(
        "all-MiniLM-L6-v2", pooling="cls", normalize=False, max_seq_length=128, query_prefix="q: "
    ),
    embedder.Settings("all-MiniLM-L6-v2", pooling="max", max_seq_length=16),
    embedder.Settings("all-MiniLM-L6-v2", pooling="mean", max_seq_length=256, precision="bf16"),
    embedder.Settings("all-MiniLM-L6-v2", pooling="cls", max_seq_length=256, precision="fp16"),
]


def light_and_full(settings: embedder.Settings) -> tuple[embedder.Embedder, embedder.Embedder]:
    """The light encoder for `settings` (made anew: `get` would give the full model once an
    earlier test loaded it) and the full one."""
    light_one = embedder._light_embedder(settings)
    assert light_one is not None
    return light_one, embedder.get(settings)


@pytest.mark.parametrize("settings", CASES, ids=lambda s: f"{s.pooling}-{s.precision}")
def test_same_vectors_as_sentence_transformers(settings: embedder.Settings) -> None:
    light_one, full = light_and_full(settings)
    assert light_one._light is not None and full._light is None
    assert light_one.info == full.info
    for text in TEXTS:  # a query is encoded alone: one text per call, as helpers do
        want = full.encode_queries([text]).astype(np.float32)  # fp16 comes back as float16
        got = light_one.encode_queries([text])
        assert got.dtype == np.float32
        assert np.array_equal(got, want), f"{text[:20]!r}: {np.abs(got - want).max():.2e}"
    assert light_one.token_counts(TEXTS) == full.token_counts(TEXTS)


def test_get_gives_the_light_encoder_unless_the_model_is_loaded() -> None:
    unloaded = embedder.Settings("all-MiniLM-L6-v2", pooling="mean", max_seq_length=99)
    with embedder.light_encoder():
        assert embedder.get(unloaded)._light is not None
    settings = CASES[0]
    full = embedder.get(settings)
    with embedder.light_encoder():
        assert embedder.get(settings) is full


def test_int8_and_the_switch_take_the_full_path(monkeypatch: pytest.MonkeyPatch) -> None:
    int8 = embedder.Settings("all-MiniLM-L6-v2", max_seq_length=256, precision="int8")
    assert embedder._light_embedder(int8) is None
    monkeypatch.setenv("PGEMBED_LIGHT_ENCODER", "0")
    settings = embedder.Settings("all-MiniLM-L6-v2", max_seq_length=200)
    with embedder.light_encoder():
        assert embedder.get(settings)._light is None


def checkpoint_copy(tmp_path: Path) -> Path:
    source = Path(embedder.resolve("all-MiniLM-L6-v2"))
    target = tmp_path / "model"
    shutil.copytree(source, target)
    return target


def edit_json(path: Path, **changes: object) -> None:
    value = json.loads(path.read_text())
    value.update(changes)
    path.write_text(json.dumps(value))


def test_checkpoints_it_cannot_reproduce(tmp_path: Path) -> None:
    directory = checkpoint_copy(tmp_path)
    assert light.load(directory, None, None, True) is not None  # a local copy: accepted
    assert light.load(directory, "weightedmean", None, True) is None
    assert light.load(directory, None, 10_000, True) is None  # beyond the position embeddings
    assert light.load(directory, None, None, True, "int8") is None

    edit_json(directory / "config.json", model_type="roberta")
    assert light.load(directory, None, None, True) is None
    edit_json(directory / "config.json", model_type="bert", hidden_act="gelu_new")
    assert light.load(directory, None, None, True) is None
    edit_json(directory / "config.json", hidden_act="gelu")

    edit_json(directory / "sentence_bert_config.json", do_lower_case=True)
    assert light.load(directory, None, None, True) is None
    edit_json(directory / "sentence_bert_config.json", do_lower_case=False)

    edit_json(directory / "config_sentence_transformers.json", default_prompt_name="query")
    assert light.load(directory, None, None, True) is None
    edit_json(directory / "config_sentence_transformers.json", default_prompt_name=None)

    modules = json.loads((directory / "modules.json").read_text())
    dense = {"idx": 3, "name": "3", "path": "3_Dense", "type": "sentence_transformers.models.Dense"}
    (directory / "modules.json").write_text(json.dumps([*modules, dense]))
    assert light.load(directory, None, None, True) is None
    (directory / "modules.json").write_text(json.dumps(modules))

    edit_json(directory / "1_Pooling" / "config.json", pooling_mode_max_tokens=True)  # two modes
    assert light.load(directory, None, None, True) is None
    assert light.load(directory, "mean", None, True) is not None  # the model's setting wins

    (directory / "model.safetensors").unlink()
    assert light.load(directory, None, None, True) is None


@pytest.mark.parametrize(
    "settings",
    [
        {"do_lower_case": False},  # transformers rebuilds the normalizer from these settings
        {"strip_accents": False},
        {"tokenize_chinese_chars": False},
        {"tokenizer_class": "RobertaTokenizer"},
    ],
    ids=lambda s: next(iter(s)),
)
def test_tokenizer_settings_it_does_not_follow(tmp_path: Path, settings: dict[str, object]) -> None:
    directory = checkpoint_copy(tmp_path)
    edit_json(directory / "tokenizer_config.json", **settings)
    assert light.load(directory, None, None, True) is None


def test_tokenizer_json_must_match_the_default_settings(tmp_path: Path) -> None:
    directory = checkpoint_copy(tmp_path)
    tokenizer = json.loads((directory / "tokenizer.json").read_text())
    tokenizer["normalizer"]["lowercase"] = False
    (directory / "tokenizer.json").write_text(json.dumps(tokenizer))
    config = json.loads((directory / "tokenizer_config.json").read_text())
    del config["do_lower_case"]  # transformers' default: lower-case
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    assert light.load(directory, None, None, True) is None
    edit_json(directory / "tokenizer_config.json", do_lower_case=False)  # now they agree
    assert light.load(directory, None, None, True) is not None
    (directory / "tokenizer_config.json").unlink()  # defaults again: lower-case
    assert light.load(directory, None, None, True) is None

    tokenizer["normalizer"] = {"type": "Lowercase"}
    (directory / "tokenizer.json").write_text(json.dumps(tokenizer))
    assert light.load(directory, None, None, True) is None


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision_weights_take_the_full_path(tmp_path: Path, dtype: str) -> None:
    import torch
    from safetensors.torch import load_file, save_file

    directory = checkpoint_copy(tmp_path)
    path = directory / "model.safetensors"
    half = {name: t.to(getattr(torch, dtype)) for name, t in load_file(str(path)).items()}
    save_file(half, str(path), metadata={"format": "pt"})
    for precision in ("fp32", "bf16", "fp16"):  # transformers would run them in their dtype
        assert light.load(directory, None, None, True, precision) is None


@pytest.mark.parametrize(
    "change",
    [
        {"attn_implementation": "eager"},
        {"_attn_implementation": "flash_attention_2"},
        {"torch_dtype": "float16"},
        {"dtype": "bfloat16"},
    ],
    ids=lambda c: next(iter(c)),
)
def test_config_settings_it_does_not_follow(tmp_path: Path, change: dict[str, object]) -> None:
    directory = checkpoint_copy(tmp_path)
    edit_json(directory / "config.json", attn_implementation="sdpa", torch_dtype="float32")
    assert light.load(directory, None, None, True) is not None
    edit_json(directory / "config.json", **change)
    assert light.load(directory, None, None, True) is None


@pytest.mark.parametrize("settings", CASES, ids=lambda s: f"{s.pooling}-{s.precision}")
def test_a_padded_batch_gives_each_text_its_own_vector(settings: embedder.Settings) -> None:
    """serve's dynamic batching encodes concurrent queries as one padded batch: each vector is
    its single-text one to float rounding, whatever its neighbours' lengths."""
    light_one = embedder._light_embedder(settings)
    assert light_one is not None
    batch = light_one.encode_queries(TEXTS * 2)
    for i, text in enumerate(TEXTS * 2):
        alone = light_one.encode_queries([text])[0]
        cosine = float(batch[i] @ alone) / float(np.linalg.norm(batch[i]) * np.linalg.norm(alone))
        tolerance = 1e-5 if settings.precision == "fp32" else 2e-3
        assert cosine > 1 - tolerance, (text, cosine)
