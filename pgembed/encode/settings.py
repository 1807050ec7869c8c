"""A model's catalog row -> the encoder settings that reproduce its vectors. One function each
for the sync workers, the searches and the lifecycle, so all encode a model the same way."""

from __future__ import annotations

from pgembed.catalog.registry import ModelSpec
from pgembed.encode import embedder, precision


def settings_of(spec: ModelSpec, device: str = "cpu") -> embedder.Settings:
    """The embedder settings that reproduce this model's vectors on `device` (cpu or cuda)."""
    return embedder.Settings(
        model_ref=spec.model_ref,
        pooling=spec.pooling,
        normalize=spec.normalize,
        max_seq_length=spec.max_seq_length,
        query_prefix=spec.query_prefix,
        document_prefix=spec.document_prefix,
        precision=precision.on_device(spec.precision, spec.precision_requested, device),
        device=device,
    )


def runtime_settings(spec: ModelSpec, device: str = "cpu") -> embedder.Settings:
    """What a sync worker encodes this model with on `device` (a GPU's 16-bit type is checked)."""
    return precision.checked(settings_of(spec, device))
