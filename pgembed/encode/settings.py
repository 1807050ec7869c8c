"""A model's catalog row -> the encoder settings that reproduce its vectors. One function each
for the sync workers, the searches and the lifecycle, so all encode a model the same way."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from typing import Any

from pgembed.catalog.registry import ModelSpec
from pgembed.encode import embedder, precision

# The fields of embedder.Settings a model records as they are, under the same names (in its
# ModelSpec, and in the requests of lifecycle/options.py); its precision is resolved per device.
RECORDED = tuple(f.name for f in fields(embedder.Settings) if f.name not in ("precision", "device"))


def encoder_settings(values: Mapping[str, Any]) -> embedder.Settings:
    """The fp32 encoder on the CPU of a model with these settings (by name): what `model add`
    and a reindex load to learn its dimensions."""
    return embedder.Settings(**{name: values[name] for name in RECORDED})


def settings_of(spec: ModelSpec, device: str = "cpu") -> embedder.Settings:
    """The embedder settings that reproduce this model's vectors on `device` (cpu, cuda or mps)."""
    return embedder.Settings(
        **{name: getattr(spec, name) for name in RECORDED},
        precision=precision.on_device(spec.precision, spec.precision_requested, device),
        device=device,
    )


def runtime_settings(spec: ModelSpec, device: str = "cpu") -> embedder.Settings:
    """What a sync worker encodes this model with on `device` (a GPU's 16-bit type is checked)."""
    return precision.checked(settings_of(spec, device))
