"""Put a loaded model into a precision: fp32 as shipped, bf16/fp16 weights, int8 Linear layers."""

from __future__ import annotations

import warnings
from typing import Any

from pgembed.errors import ModelLoadError

PRECISIONS = ("fp32", "bf16", "fp16", "int8")


def apply(model: Any, precision: str, device: str) -> Any:
    """The model, converted in place; raises ModelLoadError for a combination that cannot run."""
    import torch

    if precision == "fp32":
        return model
    if precision == "bf16":
        return model.to(torch.bfloat16)
    if precision == "fp16":
        return model.to(torch.float16)
    if precision == "int8":
        if device != "cpu":
            raise ModelLoadError("int8 (dynamic quantization) runs only on the CPU")
        return _quantize_int8(model)
    raise ModelLoadError(f"unknown precision {precision!r}: use {', '.join(PRECISIONS)}")


def _quantize_int8(model: Any) -> Any:
    """torch's dynamic quantization: int8 weights, activations quantized on the fly per batch."""
    import torch

    try:
        from torch.ao.quantization import quantize_dynamic
    except ImportError:
        raise ModelLoadError("this torch has no dynamic int8 quantization") from None
    # The API is deprecated in favour of torchao, which is not a dependency; it still works.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return quantize_dynamic(  # type: ignore[no-untyped-call]
            model, {torch.nn.Linear}, dtype=torch.qint8, inplace=True
        )
