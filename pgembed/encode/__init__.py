"""Turning text into vectors: model loading, length-sorted batches, precision, hardware."""
