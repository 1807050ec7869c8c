"""What the machine offers the encoder: the CPUs this process may use (affinity, cgroup quota),
native bf16, a CUDA GPU, an Apple GPU (MPS)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from pgembed.errors import ConfigError, UsageError

DEVICES = ("auto", "cpu", "cuda", "mps")

# CPU features that multiply bf16 in hardware (x86: AVX512-BF16, AMX; arm64: the BF16 extension).
_BF16_FLAGS = ("avx512_bf16", "amx_bf16", "bf16")
_VNNI_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8")

_threads_lock = threading.Lock()
_threads_set = False


CGROUP_ROOT = Path("/sys/fs/cgroup")


def cores() -> int:
    """The CPUs this process may use: the cores it may run on (a container's cpuset or `taskset`
    may give fewer than exist), and no more than its cgroup's CPU quota (`docker --cpus`, a
    Kubernetes limit), which leaves every core visible but throttles the threads past it."""
    try:
        affinity = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        affinity = os.cpu_count() or 1
    return usable_cpus(affinity, cpu_quota())


def usable_cpus(affinity: int, quota: float | None) -> int:
    """`affinity` cores, at most the quota's whole CPUs (1.5 CPUs: 1 thread, as a second would be
    throttled half the time), at least one."""
    if quota is None:
        return affinity
    return max(1, min(affinity, int(quota)))


def cpu_quota(root: Path = CGROUP_ROOT, membership: str | None = None) -> float | None:
    """The tightest CPU quota, in CPUs, of this process's cgroup and its parents: cgroup v2's
    cpu.max, or v1's cpu.cfs_quota_us over cpu.cfs_period_us; None when none is set or readable.
    `membership`: /proc/self/cgroup's text (read when None)."""
    if membership is None:
        try:
            membership = Path("/proc/self/cgroup").read_text(encoding="utf-8")
        except OSError:
            return None
    found: list[float] = []
    for line in membership.splitlines():
        hierarchy, controllers, path = [*line.split(":", 2), "", ""][:3]
        if hierarchy == "0" and not controllers:  # v2 (unified; under unified/ on a hybrid host)
            base = root if (root / "cgroup.controllers").exists() else root / "unified"
            found += [q for d in _and_parents(base, path) if (q := _v2(d)) is not None]
        elif "cpu" in controllers.split(","):  # v1's cpu controller
            base = root / "cpu" if (root / "cpu").is_dir() else root / controllers
            found += [q for d in _and_parents(base, path) if (q := _v1(d)) is not None]
    return min(found, default=None)


def _and_parents(base: Path, path: str) -> list[Path]:
    """base/path and each parent up to base, those that exist (inside a container its own
    cgroup is often mounted as the root, whatever /proc/self/cgroup names)."""
    parts = [p for p in path.strip("/").split("/") if p]
    dirs = [base.joinpath(*parts[:n]) for n in range(len(parts), -1, -1)]
    return [d for d in dirs if d.is_dir()]


def _v2(directory: Path) -> float | None:
    try:
        quota, period = (directory / "cpu.max").read_text(encoding="ascii").split()[:2]
    except (OSError, ValueError):
        return None
    return None if quota == "max" else _ratio(quota, period)


def _v1(directory: Path) -> float | None:
    try:
        quota = (directory / "cpu.cfs_quota_us").read_text(encoding="ascii").strip()
        period = (directory / "cpu.cfs_period_us").read_text(encoding="ascii").strip()
    except OSError:
        return None
    return _ratio(quota, period)


def _ratio(quota: str, period: str) -> float | None:
    """quota/period in CPUs; None for no limit (v1's -1) or what does not parse."""
    try:
        q, p = int(quota), int(period)
    except ValueError:
        return None
    return q / p if q > 0 and p > 0 else None


def use_all_cores() -> int:
    """Give torch one intra-op thread per core we were given, once per process; an explicit
    OMP_NUM_THREADS (torch's own setting, read at its start) is kept: whoever set it knows what
    else shares the cores."""
    global _threads_set
    import torch

    with _threads_lock:
        if not _threads_set:
            if not os.environ.get("OMP_NUM_THREADS", "").strip():
                torch.set_num_threads(cores())
            _threads_set = True
    return int(torch.get_num_threads())


def cpu_features() -> set[str]:
    """CPU feature flags as torch sees them, else as the kernel lists them."""
    import torch

    get = getattr(getattr(torch, "cpu", None), "get_capabilities", None)
    if get is not None:
        return {name for name, value in get().items() if value is True}
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8")
    except OSError:
        return set()
    return {flag for line in text.splitlines() if line.startswith("flags") for flag in line.split()}


def cpu_has_native_bf16() -> bool:
    """The CPU multiplies bf16 in hardware and torch may use it (ATEN_CPU_CAPABILITY=avx2, as
    on a CPU without AVX-512, leaves bf16 emulated whatever the flags say)."""
    if cpu_capability() in ("AVX2", "NO AVX"):
        return False
    return any(flag in cpu_features() for flag in _BF16_FLAGS)


def cpu_has_vnni() -> bool:
    """x86's 8-bit dot products (VNNI, AMX): onnxruntime multiplies uint8 by int8 exactly with
    them; without them its AVX2 kernel adds pairs of products in 16 bits, which can saturate."""
    return any(flag in cpu_features() for flag in _VNNI_FLAGS)


def cpu_capability() -> str:
    """torch's name for the vector instructions it uses here, e.g. AVX2 or AVX512."""
    import torch

    return str(torch.backends.cpu.get_cpu_capability())


def cuda_available() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def cuda_half() -> str:
    """The GPU's best 16-bit type: bf16 where it computes in bf16 (Ampere and later), else fp16."""
    import torch

    return "bf16" if torch.cuda.is_bf16_supported() else "fp16"


def mps_available() -> bool:
    """An Apple Silicon GPU that torch can use (its Metal backend, device "mps")."""
    import torch

    backend = getattr(torch.backends, "mps", None)
    return bool(backend is not None and backend.is_available())


def choose_device(requested: str, *, cuda: bool, mps: bool) -> str:
    """The device `requested` (one of DEVICES) means, given which GPUs torch can use: auto is
    CUDA, then MPS, then the CPU; an explicit GPU that is not there is a one-line error."""
    if requested not in DEVICES:
        raise UsageError(f"invalid device {requested!r}: use {', '.join(DEVICES)}")
    if requested == "auto":
        return "cuda" if cuda else "mps" if mps else "cpu"
    if requested == "cuda" and not cuda:
        raise ConfigError("--device cuda: no CUDA GPU is visible to torch on this machine")
    if requested == "mps" and not mps:
        raise ConfigError("--device mps: no Apple GPU (MPS) is available to torch on this machine")
    return requested


def resolve_device(requested: str) -> str:
    """choose_device with the GPUs this machine has (looked for only when they matter)."""
    if requested not in ("auto", "cuda", "mps"):
        return choose_device(requested, cuda=False, mps=False)  # cpu, or an unknown name's error
    cuda = requested != "mps" and cuda_available()
    mps = requested != "cuda" and not cuda and mps_available()
    return choose_device(requested, cuda=cuda, mps=mps)
