"""Devices and precisions without a model: the CPU's bf16, torch threads, which device `--device`
means for every set of GPUs (no Apple machine needed), which precision runs where, refused
precisions, the device a reindex encodes on."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import click
import pytest

from helpers import run_cli_here
from pgembed import defaults
from pgembed.cli import model as cli_model
from pgembed.cli import reindex as cli_reindex
from pgembed.encode import convert, hardware, precision
from pgembed.errors import ConfigError, ModelLoadError, UsageError
from pgembed.lifecycle import reindex


def test_native_bf16_is_what_torch_and_the_kernel_report() -> None:
    flags = set(Path("/proc/cpuinfo").read_text().split())
    kernel_says = bool(flags & {"avx512_bf16", "amx_bf16"})
    assert hardware.cpu_has_native_bf16() == kernel_says
    # This development machine: AMD EPYC with AVX2 only (no AVX-512), so no native bf16.
    if "avx512f" not in flags:
        assert hardware.cpu_capability() in {"AVX2", "DEFAULT"}
        assert not hardware.cpu_has_native_bf16()


# (cuda visible, mps available) -> what auto, cpu, cuda and mps mean; None: the one-line error.
CHOICES: dict[tuple[bool, bool], dict[str, str | None]] = {
    (False, False): {"auto": "cpu", "cpu": "cpu", "cuda": None, "mps": None},
    (True, False): {"auto": "cuda", "cpu": "cpu", "cuda": "cuda", "mps": None},
    (False, True): {"auto": "mps", "cpu": "cpu", "cuda": None, "mps": "mps"},
    (True, True): {"auto": "cuda", "cpu": "cpu", "cuda": "cuda", "mps": "mps"},
}
MISSING = {
    "cuda": "--device cuda: no CUDA GPU is visible to torch on this machine",
    "mps": "--device mps: no Apple GPU (MPS) is available to torch on this machine",
}


@pytest.mark.parametrize(("cuda", "mps"), list(CHOICES))
def test_device_choice_for_every_set_of_gpus(cuda: bool, mps: bool) -> None:
    assert set(CHOICES[cuda, mps]) == set(hardware.DEVICES)
    for requested, expected in CHOICES[cuda, mps].items():
        if expected is None:
            with pytest.raises(ConfigError) as raised:
                hardware.choose_device(requested, cuda=cuda, mps=mps)
            assert str(raised.value) == MISSING[requested]
        else:
            assert hardware.choose_device(requested, cuda=cuda, mps=mps) == expected
    with pytest.raises(UsageError, match=r"invalid device 'tpu': use auto, cpu, cuda, mps"):
        hardware.choose_device("tpu", cuda=cuda, mps=mps)


def test_resolve_device_asks_this_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    for cuda, mps in CHOICES:
        monkeypatch.setattr(hardware, "cuda_available", lambda cuda=cuda: cuda)
        monkeypatch.setattr(hardware, "mps_available", lambda mps=mps: mps)
        for requested, expected in CHOICES[cuda, mps].items():
            if expected is not None:
                assert hardware.resolve_device(requested) == expected


def test_mps_without_an_apple_gpu_is_one_line() -> None:
    """This machine (Linux) has no MPS: the real check says so; `sync` stops in one line before
    it connects anywhere, and a reindex's fill options (read once connected) say the same."""
    assert not hardware.mps_available()
    url = "postgresql://nobody@localhost:1/none"
    result = run_cli_here("--database-url", url, "sync", "--once", "--device", "mps")
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr == f"pgembed: error: {MISSING['mps']}\n"
    for command, args in ((cli_reindex.reindex_cmd, ["m"]), (cli_model.model_alter, ["m"])):
        with pytest.raises(ConfigError) as raised:
            _fill_options(command, [*args, "--device", "mps"])
        assert str(raised.value) == MISSING["mps"]


def test_precision_on_each_device() -> None:
    assert precision.on_device("bf16", "auto", "cpu") == "bf16"
    assert precision.on_device("int8", "int8", "cpu") == "int8"
    assert precision.on_device("fp16", "auto", "cpu") == "fp32"  # CPUs only emulate fp16
    assert precision.on_device("fp32", "fp32", "cuda") == "fp32"
    assert precision.on_device("int8", "int8", "cuda") == "fp32"  # dynamic int8 is CPU-only
    # An Apple GPU: fp16 for auto and either 16-bit type; int8 and the onnx engines are CPU-only.
    for stored, requested in (
        ("bf16", "auto"),
        ("fp32", "auto"),
        ("bf16", "bf16"),
        ("fp16", "fp16"),
    ):
        assert precision.on_device(stored, requested, "mps") == "fp16"
    for stored in ("fp32", "int8", "onnx-int8-token", "onnx-fp32"):
        assert precision.on_device(stored, stored, "mps") == "fp32"
    assert precision.auto_candidates("mps")[0] == ["fp16", "fp32"]
    assert defaults.batch_size("mps") == defaults.batch_size("cuda") == defaults.GPU_BATCH_SIZE
    assert defaults.claim_size("mps") == defaults.claim_size("cuda") == defaults.GPU_CLAIM_SIZE
    assert defaults.claim_size("cpu") == defaults.CPU_CLAIM_SIZE


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


def _cgroup(root: Path, files: dict[str, str]) -> Path:
    """A cgroup tree of files under `root`, as the kernel shows one."""
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def test_the_cpus_a_process_may_use_follow_affinity_and_the_cgroup_quota(tmp_path: Path) -> None:
    """A container's quota (docker --cpus 1.5: cpu.max "150000 100000") leaves every core visible
    to the affinity mask but throttles threads past it: whole CPUs of the tightest quota of the
    process's cgroup and its parents, v2 or v1, at least one."""
    v2 = _cgroup(tmp_path / "v2", {"cgroup.controllers": "cpu", "cpu.max": "150000 100000\n"})
    assert hardware.cpu_quota(v2, "0::/\n") == 1.5
    nested = _cgroup(
        tmp_path / "nested",
        {"cgroup.controllers": "", "app/cpu.max": "50000 100000", "app/web/cpu.max": "max 1000"},
    )
    assert hardware.cpu_quota(nested, "0::/app/web\n") == 0.5  # the parent's is tighter
    hybrid = _cgroup(tmp_path / "hybrid", {"unified/cgroup.procs": "", "cpu/cpu.cfs_quota_us": "-1",
                                           "cpu/cpu.cfs_period_us": "100000"})  # fmt: skip
    assert hardware.cpu_quota(hybrid, "1:cpu:/\n0::/\n") is None  # v1's -1: no limit
    v1 = _cgroup(
        tmp_path / "v1", {"cpu/cpu.cfs_quota_us": "300000", "cpu/cpu.cfs_period_us": "100000"}
    )
    # Inside a container its own cgroup is mounted as the root, whatever the path says.
    assert hardware.cpu_quota(v1, "4:cpu,cpuacct:/docker/abc\n") == 3.0
    assert hardware.cpu_quota(tmp_path / "none", "0::/\n") is None
    assert hardware.cpu_quota(v2, "garbage\n") is None
    assert [hardware.usable_cpus(4, q) for q in (None, 2.5, 0.2, 8.0)] == [4, 2, 1, 4]
    affinity = len(os.sched_getaffinity(0))
    assert hardware.cores() == hardware.usable_cpus(affinity, hardware.cpu_quota())
