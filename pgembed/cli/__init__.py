"""The `pgembed` command line."""

from pgembed.cli.main import main

__all__ = ["main"]
