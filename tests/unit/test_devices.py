"""Devices and precisions without a model: the CPU's bf16, torch threads, which precision runs
where, refused precisions, the device a reindex encodes on."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import click
import pytest

from pgembed import defaults
from pgembed.cli import model as cli_model
from pgembed.cli import reindex as cli_reindex
from pgembed.encode import convert, hardware, precision
from pgembed.errors import ConfigError, ModelLoadError
from pgembed.lifecycle import reindex


def test_native_bf16_is_what_torch_and_the_kernel_report() -> None:
    flags = set(Path("/proc/cpuinfo").read_text().split())
    kernel_says = bool(flags & {"avx512_bf16", "amx_bf16"})
    assert hardware.cpu_has_native_bf16() == kernel_says
    # This development machine: AMD EPYC with AVX2 only (no AVX-512), so no native bf16.
    if "avx512f" not in flags:
        assert hardware.cpu_capability() in {"AVX2", "DEFAULT"}
        assert not hardware.cpu_has_native_bf16()


def test_precision_on_each_device() -> None:
    assert precision.on_device("bf16", "auto", "cpu") == "bf16"
    assert precision.on_device("int8", "int8", "cpu") == "int8"
    assert precision.on_device("fp16", "auto", "cpu") == "fp32"  # CPUs only emulate fp16
    assert precision.on_device("fp32", "fp32", "cuda") == "fp32"
    assert precision.on_device("int8", "int8", "cuda") == "fp32"  # dynamic int8 is CPU-only


def test_worker_uses_one_torch_thread_per_core_it_is_given_unless_told() -> None:
    """One core given: one thread. All cores given but OMP_NUM_THREADS=1: one thread."""
    use = "from pgembed.encode import hardware; print(hardware.use_all_cores())"
    one_core = "import os; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}); " + use
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    for code, told in ((one_core, None), (use, "1")):
        run_env = env if told is None else {**env, "OMP_NUM_THREADS": told}
        run = [sys.executable, "-c", code]
        out = subprocess.run(run, capture_output=True, text=True, timeout=120, env=run_env)
        assert out.stdout.split() == ["1"], (told, out.stderr[-2000:])
    assert hardware.cores() == len(os.sched_getaffinity(0))


def test_int8_is_cpu_only_and_unknown_precisions_are_refused() -> None:
    with pytest.raises(ModelLoadError, match="runs only on the CPU"):
        convert.apply(object(), "int8", "cuda")
    with pytest.raises(ModelLoadError, match="unknown precision 'fp8'"):
        convert.apply(object(), "fp8", "cpu")


def _fill_options(command: click.Command, args: list[str]) -> reindex.Options:
    """The reindex Options the command line `args` gives (parsed as click parses them)."""
    with command.make_context(command.name or "", list(args)) as ctx:  # click consumes it
        return cli_reindex.run_options(ctx.params)


@pytest.mark.parametrize(
    ("command", "args"),
    [(cli_reindex.reindex_cmd, ["m"]), (cli_model.model_alter, ["m", "--pooling", "cls"])],
)
def test_reindex_encodes_where_sync_would(
    monkeypatch: pytest.MonkeyPatch, command: click.Command, args: list[str]
) -> None:
    # `pgembed reindex` and `model alter` passed no device, so their worker encoded on the CPU
    # beside a GPU that `pgembed sync` and `model add --backfill` used: now all resolve alike.
    for gpu in (True, False):
        monkeypatch.setattr(hardware, "cuda_available", lambda gpu=gpu: gpu)
        assert _fill_options(command, args).device == hardware.resolve_device("auto")
        assert _fill_options(command, args).device == ("cuda" if gpu else "cpu")
        assert _fill_options(command, [*args, "--device", "cpu"]).device == "cpu"
    with pytest.raises(ConfigError, match="no CUDA GPU"):
        _fill_options(command, [*args, "--device", "cuda"])


def test_claim_size(capsys: pytest.CaptureFixture[str]) -> None:
    command = cli_reindex.reindex_cmd
    assert _fill_options(command, ["m"]).claim_size == defaults.REINDEX_CLAIM_SIZE
    assert _fill_options(command, ["m", "--claim-size", "8"]).claim_size == 8
    assert capsys.readouterr().err == ""
