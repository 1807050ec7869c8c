"""Logging for the daemon: one line per event, as text or as JSON for log shippers."""

from __future__ import annotations

import json
import logging
import time

from pgembed.cli.terminal import printable


class TextFormatter(logging.Formatter):
    """One line per event, whatever database text its message carries shown inert."""

    def format(self, record: logging.LogRecord) -> str:
        return printable(super().format(record), lines=True)


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        payload = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            payload["error"] = self.formatException(record.exc_info)
        return json.dumps(payload)


def setup_logging(fmt: str = "text", *, quiet: bool = False) -> None:
    """INFO to stderr; `quiet` keeps per-batch lines out of the way of a progress bar."""
    handler = logging.StreamHandler()
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(TextFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger("pgembed")
    root.handlers[:] = [handler]
    root.setLevel(logging.WARNING if quiet else logging.INFO)
    root.propagate = False
