"""What the machine offers the encoder: cores, native bf16, a CUDA GPU, an Apple GPU (MPS)."""

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


def cores() -> int:
    """The cores this process may run on (a container or `taskset` may give fewer than exist)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


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
