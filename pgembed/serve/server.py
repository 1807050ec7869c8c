"""The HTTP server: the standard library's ThreadingHTTPServer (a thread per connection) in front
of an Api. JSON in and out; every error is {"error": "one line"} with its status, never a
traceback; one log line per request (method, path, status, milliseconds) at INFO.

Bound to a loopback address, it answers only requests whose Host is localhost, 127.0.0.1, [::1]
or the address it was given (else 421): a web page whose name was rebound to 127.0.0.1 (DNS
rebinding) cannot read it as same-origin.

Routes: POST /search, GET /models, GET /healthz, GET / (the search page).
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import logging
import socket
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from pgembed.serve import page
from pgembed.serve.api import Api, ApiError, status_of

log = logging.getLogger("pgembed.serve")

MAX_BODY = 1 << 20  # bytes: a search request is a few hundred
IDLE_SECONDS = 30  # a keep-alive connection with no request for this long is closed
STOP_WAIT_SECONDS = 10  # `stop` waits this long at most for the requests in flight
_LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]")

_ROUTES = {"/search": "POST", "/models": "GET", "/healthz": "GET", "/": "GET"}


class Reply:
    def __init__(self, status: int, body: bytes, content_type: str, **headers: str) -> None:
        self.status = status
        self.body = body
        self.content_type = content_type
        self.headers = headers


def json_reply(status: int, value: Any, **headers: str) -> Reply:
    body = json.dumps(value, ensure_ascii=False, default=str).encode()
    return Reply(status, body, "application/json; charset=utf-8", **headers)


def error_reply(status: int, message: str, **headers: str) -> Reply:
    return json_reply(status, {"error": message}, **headers)


class Handler(BaseHTTPRequestHandler):
    server: SearchServer
    protocol_version = "HTTP/1.1"  # keep-alive: every reply carries its Content-Length
    disable_nagle_algorithm = True  # else a reply waits ~40 ms for a delayed ACK
    server_version = "pgembed"
    timeout = IDLE_SECONDS

    def do_GET(self) -> None:
        self._answer("GET")

    def do_POST(self) -> None:
        self._answer("POST")

    def do_HEAD(self) -> None:
        self._answer("HEAD")

    def _answer(self, method: str) -> None:
        started = time.perf_counter()
        path = self.path.split("?", 1)[0]
        with self.server.in_flight():
            try:
                reply = self._route(method, path)
            except Exception as exc:
                status, message = status_of(exc)
                if status == 500 and not isinstance(exc, ApiError):
                    log.error("%s %s failed", method, path, exc_info=True)
                reply = error_reply(status, message)
            log.info(  # before the reply goes out: a client that has it finds the line logged
                "%s %s %d %.1fms",
                method,
                path,
                reply.status,
                (time.perf_counter() - started) * 1000,
            )
            self._send(reply, head=method == "HEAD")

    def _route(self, method: str, path: str) -> Reply:
        api = self.server.api
        if not self.server.host_allowed(self.headers.get("Host")):
            self.close_connection = True  # its body is not read
            return error_reply(421, "this server answers only for localhost (see docs/serve.md)")
        if (method, path) == ("POST", "/search"):
            return json_reply(200, api.search(self._json_body()))
        self._discard_body()
        allowed = _ROUTES.get(path)
        if allowed is None:
            return error_reply(404, f"no such endpoint {path!r}: see GET /, /models, /healthz")
        if method != allowed and not (method == "HEAD" and allowed == "GET"):
            return error_reply(405, f"{path} takes {allowed}", Allow=allowed)
        if path == "/models":
            return json_reply(200, api.models())
        if path == "/healthz":
            return json_reply(200, api.health())
        html = page.render([m["name"] for m in api.models()["models"]])
        return Reply(200, html.encode(), "text/html; charset=utf-8")

    def _json_body(self) -> object:
        body = self._read_body()
        try:
            return json.loads(body)
        except RecursionError:
            raise ApiError(400, "the body is not valid JSON: it is nested too deeply") from None
        except ValueError as exc:  # not UTF-8 (UnicodeDecodeError), not JSON (JSONDecodeError)
            raise ApiError(400, f"the body is not valid JSON: {exc}") from None

    def _read_body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            self.close_connection = True
            raise ApiError(411, "send the body with a Content-Length, not chunked")
        length = self.headers.get("Content-Length")
        try:
            size = int(length) if length is not None else 0
        except ValueError:
            size = -1
        if size < 0:
            self.close_connection = True
            raise ApiError(400, f"invalid Content-Length {length!r}")
        if size > MAX_BODY:
            self.close_connection = True  # its body is not read: the connection cannot go on
            raise ApiError(413, f"the body is larger than {MAX_BODY} bytes")
        body = self.rfile.read(size)
        if len(body) < size:
            self.close_connection = True
            raise ApiError(400, "the body ended before its Content-Length")
        return body

    def _discard_body(self) -> None:
        """Read a body nobody wants, so the next request on this connection starts clean."""
        with contextlib.suppress(ApiError):
            self._read_body()

    def _send(self, reply: Reply, *, head: bool = False) -> None:
        self.send_response(reply.status)
        self.send_header("Content-Type", reply.content_type)
        self.send_header("Content-Length", str(len(reply.body)))
        self.send_header("Cache-Control", "no-store")
        for name, value in reply.headers.items():
            self.send_header(name, value)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if not head:
            self.wfile.write(reply.body)

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """http.server's own errors (malformed request line, headers too long, unsupported
        method) in JSON too."""
        self.close_connection = True
        try:
            text = message or HTTPStatus(code).phrase
        except ValueError:
            text = message or "error"
        self._send(error_reply(code, text))
        method, path = getattr(self, "command", None), getattr(self, "path", None)
        log.info("%s %s %d", method or "-", path or "-", code)

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: _answer logs one line per request through logging instead."""


class SearchServer(ThreadingHTTPServer):
    """Binds at construction (port 0: any free port, see `port`); `serve_forever` until
    `shutdown`. Threads are daemons: an idle keep-alive connection never holds up an exit."""

    daemon_threads = True

    def __init__(
        self,
        api: Api,
        host: str = "127.0.0.1",
        port: int = 8765,
        allowed_hosts: Sequence[str] = (),
    ) -> None:
        """`allowed_hosts`: Host names answered besides the loopback ones; given, the Host check
        applies on any address (a container binds 0.0.0.0 to be published on 127.0.0.1)."""
        self.api = api
        if ":" in host:
            self.address_family = socket.AF_INET6
        super().__init__((host, port), Handler)
        self._busy = 0
        self._idle = threading.Condition()
        bound = str(self.server_address[0])
        self._hosts: frozenset[str] | None = None  # None: any Host (not bound to a loopback)
        names = tuple(allowed_hosts)
        if _is_loopback(host) or _is_loopback(bound):
            names = (*_LOOPBACK_NAMES, host, bound, *names)
        if names:
            self._hosts = frozenset(
                f"[{n.lower()}]" if ":" in n and not n.startswith("[") else n.lower() for n in names
            )

    def host_allowed(self, header: str | None) -> bool:
        """Whether a request with this Host header is answered (the port does not matter)."""
        if self._hosts is None:
            return True
        if header is None:
            return False
        name = header.strip().lower()  # "[::1]:8765" -> "[::1]", "localhost:8765" -> "localhost"
        bracketed = name.startswith("[") and "]" in name
        name = name.partition("]")[0] + "]" if bracketed else name.partition(":")[0]
        return name in self._hosts

    @contextlib.contextmanager
    def in_flight(self) -> Iterator[None]:
        """Around a request: `stop` waits for those inside."""
        with self._idle:
            self._busy += 1
        try:
            yield
        finally:
            with self._idle:
                self._busy -= 1
                self._idle.notify_all()

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    @property
    def url(self) -> str:
        host = str(self.server_address[0])
        return f"http://{f'[{host}]' if ':' in host else host}:{self.port}"

    def start(self) -> threading.Thread:
        """Serve in a background thread (tests, benchmarks); stop with `stop`."""
        thread = threading.Thread(target=self.serve_forever, name="pgembed-serve", daemon=True)
        thread.start()
        return thread

    def handle_error(self, request: Any, client_address: Any) -> None:
        """An error outside _answer's (the client went away mid-reply, mostly): one log line,
        not socketserver's traceback on stderr."""
        error = sys.exc_info()[1]
        if isinstance(error, ConnectionError | TimeoutError):
            log.debug("client %s: %s", client_address, error)
        else:
            log.error("client %s: %s", client_address, error, exc_info=True)

    def stop(self) -> None:
        """Stop accepting, wait for the requests in flight to be answered (STOP_WAIT_SECONDS at
        most), then close the socket; the Api (its pool) can be closed after. Idle keep-alive
        connections are not waited for (their threads are daemons)."""
        self.shutdown()
        with self._idle:
            if not self._idle.wait_for(lambda: self._busy == 0, timeout=STOP_WAIT_SECONDS):
                log.warning("stopping with %d requests still unanswered", self._busy)
        self.server_close()


def _is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
