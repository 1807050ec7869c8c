"""One family of errors; the CLI prints each as one line and exits with its code."""

from __future__ import annotations


class PgembedError(Exception):
    """Base of every error pgembed reports to a user."""

    exit_code = 1


class UsageError(PgembedError):
    """The user asked for something malformed (bad identifier, bad option value)."""

    exit_code = 2


class ConfigError(PgembedError):
    """The configuration (database URL, data directory) cannot be used."""


class DatabaseError(PgembedError):
    """The database cannot be reached or refused an operation."""


class SchemaError(PgembedError):
    """The pgembed schema is missing, behind, or its migrations were tampered with."""


class NotFoundError(PgembedError):
    """A table, column or model the user named does not exist."""


class ModelLoadError(PgembedError):
    """A model reference cannot be resolved or loaded offline."""
