"""The ASGI middleware around the application, each pure ASGI (so it sees every request,
routed or not) with one job; make_app stacks them as Guard(HostCheck(InFlightLimit(app))).

Starlette's TrustedHostMiddleware and uvicorn's limit_concurrency were weighed for the two
checks and not taken (docs/decisions.md): the first answers a plain-text 400 that does not
name the Host names answered, the second a plain-text 503 without Retry-After, counting open
connections (idle keep-alive ones too) rather than requests.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from pgembed.serve import page

log = logging.getLogger("pgembed.serve")

RETRY_AFTER = "1"  # seconds, in a 503 for a server at its limit

# What every answer carries. The page's script and style are inline; the CSP allows those two
# (by hash) and nothing else: no other script, no frame around it, no form sent elsewhere.
SECURITY_HEADERS = [
    (b"content-security-policy", page.CSP.encode()),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"cache-control", b"no-store"),
]


def dumps(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, default=str).encode()


class JsonError(Response):
    media_type = "application/json"

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(dumps({"error": message}), status, headers)


class Guard:
    """Outermost: the security headers and one log line on every answer, and a JSON 503 for a
    request still running when the server, stopping, cancels it."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        method, path = scope["method"], scope["path"]
        replied = False

        async def answer(message: Message) -> None:
            nonlocal replied
            if message["type"] == "http.response.start":
                replied = True
                message["headers"] = [*message.get("headers", []), *SECURITY_HEADERS]
                log.info(  # before the reply goes out: a client that has it finds the line logged
                    "%s %s %d %.1fms",
                    method,
                    path,
                    message["status"],
                    (time.perf_counter() - started) * 1000,
                )
            await send(message)

        try:
            await self.app(scope, receive, answer)
        except asyncio.CancelledError:
            # uvicorn cancels what is still running `--stop-timeout` seconds after a stop began;
            # its own answer was a plain-text 500 and a traceback in the log.
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
            if replied:
                log.warning("%s %s cut short: the server is stopping", method, path)
                return
            stopping = JsonError(503, "the server is shutting down", {"Connection": "close"})
            await stopping(scope, receive, answer)


class HostCheck:
    """A request whose Host (the port aside) is not one of `hosts` gets 421 naming them (None:
    any Host is answered). Bound to a loopback address, this stops DNS rebinding: a web page
    whose name was rebound to 127.0.0.1 cannot read the API as same-origin."""

    def __init__(self, app: ASGIApp, hosts: frozenset[str] | None) -> None:
        self.app = app
        self.hosts = hosts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.allowed(dict(scope["headers"]).get(b"host")):
            await self.app(scope, receive, send)
            return
        names = ", ".join(sorted(self.hosts or ()))
        message = f"this server answers only for Host {names} (see docs/serve.md)"
        await JsonError(421, message, {"Connection": "close"})(scope, receive, send)

    def allowed(self, header: bytes | None) -> bool:
        """Whether a request with this Host header is answered (the port does not matter)."""
        if self.hosts is None:
            return True
        if header is None:
            return False
        name = header.decode("latin-1").strip().lower()  # "[::1]:8765" -> "[::1]"
        bracketed = name.startswith("[") and "]" in name
        name = name.partition("]")[0] + "]" if bracketed else name.partition(":")[0]
        return name in self.hosts


class InFlightLimit:
    """At most `limit` requests answered at once: past it, 503 with Retry-After at once (its
    body not read), not a queue without end."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit
        self.in_flight = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.in_flight >= self.limit:
            busy = f"the server is answering {self.in_flight} requests, its limit: retry shortly"
            await JsonError(503, busy, {"Retry-After": RETRY_AFTER})(scope, receive, send)
            return
        self.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.in_flight -= 1
