"""The server: uvicorn (its h11 HTTP/1.1 implementation) serving app.py's application on a
socket bound at construction, in a thread of its own with its own event loop; `pgembed serve`
and the tests start and stop it the same way. Only uvicorn's public settings are used.

What uvicorn takes on: parsing, keep-alive (idle connections closed after IDLE_SECONDS), a
listen backlog of BACKLOG connections (a burst of clients waits to be accepted instead of being
reset), graceful stop, and one task per request rather than one thread per connection, so
hundreds of waiting clients cost little. front.py adds what it has no setting for: a time limit
on a request's head (`head_seconds`, `serve --request-timeout`) and a JSON 400 for a head it
cannot parse.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
import socket
import threading
import time
from collections.abc import Sequence
from typing import Any

import uvicorn

from pgembed import defaults
from pgembed.serve import front
from pgembed.serve.api import Api
from pgembed.serve.app import MAX_IN_FLIGHT, make_app

log = logging.getLogger("pgembed.serve")

IDLE_SECONDS = 30  # a keep-alive connection with no request for this long is closed
ACCEPT_LOG_SECONDS = 60.0  # out of file descriptors, accept's failure is logged once this often
BACKLOG = 2048  # connections the kernel holds for accepting
_LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]")


class SearchServer:
    """Binds at construction (port 0: any free port, see `port`); `start` serves in a thread
    until `stop`. At most `max_in_flight` requests are answered at once: past it, 503 with
    Retry-After."""

    def __init__(
        self,
        api: Api,
        host: str = "127.0.0.1",
        port: int = 8765,
        *,
        allowed_hosts: Sequence[str] = (),
        max_in_flight: int = MAX_IN_FLIGHT,
        body_seconds: float = defaults.SERVE_REQUEST_TIMEOUT,
        head_seconds: float = defaults.SERVE_REQUEST_TIMEOUT,
        stop_seconds: int = defaults.SERVE_STOP_TIMEOUT,
    ) -> None:
        """`allowed_hosts`: Host names answered besides the loopback ones; given, the Host check
        applies on any address (a container binds 0.0.0.0 to be published on 127.0.0.1)."""
        self.api = api
        self._socket = _listen(host, port)
        bound = str(self._socket.getsockname()[0])
        self._address = (bound, int(self._socket.getsockname()[1]))
        hosts: frozenset[str] | None = None  # None: any Host (not bound to a loopback)
        names = tuple(allowed_hosts)
        if _is_loopback(host) or _is_loopback(bound):
            names = (*_LOOPBACK_NAMES, host, bound, *names)
        if names:
            hosts = frozenset(
                f"[{n.lower()}]" if ":" in n and not n.startswith("[") else n.lower() for n in names
            )
        self._fronts: front.Fronts = {}
        self._head_seconds = head_seconds
        self._stop_seconds = stop_seconds
        app = make_app(api, hosts, max_in_flight=max_in_flight, body_seconds=body_seconds)
        config = uvicorn.Config(
            front.Answered(app, self._fronts),
            http="h11",
            ws="none",
            lifespan="on",
            log_config=None,  # pgembed's logging, one line per request (guards.Guard)
            log_level="warning",  # not uvicorn's own start and stop lines
            access_log=False,
            server_header=False,
            date_header=False,
            timeout_keep_alive=IDLE_SECONDS,
            timeout_graceful_shutdown=stop_seconds,
            backlog=BACKLOG,
            h11_max_incomplete_event_size=front.HEAD_BYTES,
            proxy_headers=False,  # a request's "client" is its connection's (front.Answered)
        )
        self._server = uvicorn.Server(config)
        self._thread: threading.Thread | None = None
        self._failed: BaseException | None = None

    @property
    def port(self) -> int:
        return self._address[1]

    @property
    def url(self) -> str:
        host = self._address[0]
        return f"http://{f'[{host}]' if ':' in host else host}:{self.port}"

    def start(self) -> threading.Thread:
        """Serve in a background thread; returns once it accepts (its pool is open)."""
        thread = threading.Thread(target=self._serve, name="pgembed-serve", daemon=True)
        self._thread = thread
        thread.start()
        while not self._server.started and thread.is_alive():
            thread.join(0.01)
        if not self._server.started:
            raise RuntimeError(f"the server did not start: {self._failed or 'see the log'}")
        return thread

    def _serve(self) -> None:
        try:
            with asyncio.Runner(loop_factory=self._loop) as runner:
                runner.run(self._serve_async())
        except BaseException as exc:  # reported by start
            self._failed = exc
            log.error("the server stopped: %s", exc, exc_info=True)

    def _loop(self) -> asyncio.AbstractEventLoop:
        return front.FrontLoop(self._fronts, self._head_seconds)

    async def _serve_async(self) -> None:
        asyncio.get_running_loop().set_exception_handler(_AcceptErrors())
        await self._server.serve(sockets=[self._socket])

    def stop(self) -> None:
        """Stop accepting, wait for the requests in flight to be answered (`stop_seconds` at
        most), then close the pool and the socket."""
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(self._stop_seconds + 5)
        self.server_close()

    def server_close(self) -> None:
        self._socket.close()


class _AcceptErrors:
    """The event loop's exception handler: out of file descriptors (or memory), asyncio reports
    each failed accept, up to the backlog's 2048 per second, with a traceback each (46 MB of log
    a minute); one line per ACCEPT_LOG_SECONDS says it instead, with the count. Anything else
    goes to asyncio's own handler."""

    def __init__(self) -> None:
        self.last = -ACCEPT_LOG_SECONDS
        self.missed = 0

    def __call__(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        if not str(context.get("message", "")).startswith("socket.accept() out of system"):
            loop.default_exception_handler(context)
            return
        self.missed += 1
        now = time.monotonic()
        if now - self.last >= ACCEPT_LOG_SECONDS:
            log.error(
                "cannot accept connections: %s (%d failed accepts; said again at most every %g s)",
                context.get("exception"),
                self.missed,
                ACCEPT_LOG_SECONDS,
            )
            self.last, self.missed = now, 0


def _listen(host: str, port: int) -> socket.socket:
    """The listening socket, its protocol IPPROTO_TCP: asyncio sets TCP_NODELAY on the sockets
    it accepts only when their protocol is TCP, and an accepted socket has the listening one's
    (socket.create_server's is 0). Without it a reply's headers and body, two writes, waited for
    the client's delayed ACK between them (~40 ms on every request)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        bound = socket.create_server((host, port), family=family, backlog=BACKLOG)
    except OSError as exc:  # its message names the address again: the errno's alone
        raise OSError(exc.errno, os.strerror(exc.errno) if exc.errno else str(exc)) from None
    return socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP, fileno=bound.detach())


def _is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
