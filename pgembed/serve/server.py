"""The server: uvicorn (its h11 HTTP/1.1 implementation) serving app.py's application on a
socket bound at construction, in a thread of its own with its own event loop; `pgembed serve`
and the tests start and stop it the same way.

What uvicorn takes on: parsing, keep-alive (idle connections closed after IDLE_SECONDS), a
listen backlog of BACKLOG connections (a burst of clients waits to be accepted instead of being
reset), and one task per request rather than one thread per connection, so hundreds of waiting
clients cost little. A request it cannot parse gets a JSON 400 too (JsonH11Protocol).
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Sequence
from typing import Any

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from pgembed.serve.api import Api
from pgembed.serve.app import BODY_SECONDS, MAX_IN_FLIGHT, make_app

log = logging.getLogger("pgembed.serve")

IDLE_SECONDS = 30  # a keep-alive connection with no request for this long is closed
HEAD_SECONDS = 10.0  # a connection without a whole request head this long after it began: closed
ACCEPT_LOG_SECONDS = 60.0  # out of file descriptors, accept's failure is logged once this often
STOP_WAIT_SECONDS = 10  # `stop` waits this long at most for the requests in flight
BACKLOG = 2048  # connections the kernel holds for accepting
_LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]")


class JsonH11Protocol(H11Protocol):
    """uvicorn's HTTP/1.1 protocol, whose answer to a request it cannot parse (a malformed
    request line, headers too long) is {"error": ...} as every other error, not plain text.
    Each connection is TCP_NODELAY: asyncio sets it only on sockets whose proto is TCP, and
    socket.create_server's have proto 0, so a reply's headers and body went out in two writes
    the second of which waited for the client's delayed ACK (~40 ms on every request)."""

    _head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        super().connection_made(transport)
        self._head_timer = self.loop.call_later(HEAD_SECONDS, self._head_timeout)

    def data_received(self, data: bytes) -> None:
        """A request's head must be whole within HEAD_SECONDS of the connection (or of its first
        bytes, on a keep-alive connection): uvicorn has no such limit, so a client that sent
        nothing, or headers a byte at a time, held its connection (and a file descriptor) for
        ever."""
        super().data_received(data)
        if self.conn.their_state is h11.IDLE:  # no whole head yet
            if self._head_timer is None and not self.transport.is_closing():
                self._head_timer = self.loop.call_later(HEAD_SECONDS, self._head_timeout)
        else:
            self._cancel_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        super().connection_lost(exc)

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timeout(self) -> None:
        """No whole request head in time: 408 to a client that sent part of one, and closed."""
        self._head_timer = None
        if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
            return
        if self.conn.trailing_data[0]:  # part of a head
            body = json.dumps(
                {"error": f"the request's headers did not arrive within {HEAD_SECONDS:g} s"}
            ).encode()
            self.transport.write(
                b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
                b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(body), body)
            )
        self.transport.close()

    def send_400_response(self, msg: str) -> None:
        body = json.dumps({"error": msg}).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
        ]
        for event in (
            h11.Response(status_code=400, headers=headers, reason=b"Bad Request"),
            h11.Data(data=body),
            h11.EndOfMessage(),
        ):
            self.transport.write(self.conn.send(event) or b"")
        self.transport.close()


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
        body_seconds: float = BODY_SECONDS,
    ) -> None:
        """`allowed_hosts`: Host names answered besides the loopback ones; given, the Host check
        applies on any address (a container binds 0.0.0.0 to be published on 127.0.0.1)."""
        self.api = api
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        try:
            self._socket = socket.create_server((host, port), family=family, backlog=BACKLOG)
        except OSError as exc:  # its message names the address again: the errno's alone
            raise OSError(exc.errno, os.strerror(exc.errno) if exc.errno else str(exc)) from None
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
        app = make_app(api, hosts, max_in_flight=max_in_flight, body_seconds=body_seconds)
        config = uvicorn.Config(
            app,
            http=JsonH11Protocol,
            lifespan="on",
            log_config=None,  # pgembed's logging, one line per request (app.Guard)
            log_level="warning",  # not uvicorn's own start and stop lines
            access_log=False,
            server_header=False,
            date_header=False,
            timeout_keep_alive=IDLE_SECONDS,
            timeout_graceful_shutdown=STOP_WAIT_SECONDS,
            backlog=BACKLOG,
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
            asyncio.run(self._serve_async())
        except BaseException as exc:  # reported by start
            self._failed = exc
            log.error("the server stopped: %s", exc, exc_info=True)

    async def _serve_async(self) -> None:
        asyncio.get_running_loop().set_exception_handler(_AcceptErrors())
        await self._server.serve(sockets=[self._socket])

    def stop(self) -> None:
        """Stop accepting, wait for the requests in flight to be answered (STOP_WAIT_SECONDS at
        most), then close the pool and the socket."""
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(STOP_WAIT_SECONDS + 5)
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


def _is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
