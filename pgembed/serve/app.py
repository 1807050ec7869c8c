"""The HTTP layer: a Starlette application in front of an Api. JSON in and out; every error is
{"error": "one line"} with its status, never a traceback; one log line per request (method,
path, status, milliseconds) at INFO.

guards.py's middleware wraps every request, before any route: the Host check (bound to a
loopback address, a request whose Host is not localhost, 127.0.0.1, [::1] or the address given
gets 421: a web page whose name was rebound to 127.0.0.1, DNS rebinding, cannot read it as
same-origin), the limit on requests in flight (past it, 503 with Retry-After at once, not a
queue without end), the security headers, and the log line.

POST /search refuses what a web page of another origin can send without the browser asking
first (a "simple" request: text/plain or a form's encoding), so only `Content-Type:
application/json` is read, and a browser's request marked cross-site (Origin, Sec-Fetch-Site) is
refused too.

Routes: POST /search, GET /models, GET /healthz, GET /metrics, GET / (the search page),
GET /favicon.svg.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp

from pgembed import defaults
from pgembed.search import planner
from pgembed.serve import page
from pgembed.serve.api import Api, ApiError, status_of
from pgembed.serve.guards import Guard, HostCheck, InFlightLimit, JsonError, dumps

log = logging.getLogger("pgembed.serve")

MAX_BODY = 1 << 20  # bytes: a search request is a few hundred
MAX_IN_FLIGHT = defaults.SERVE_MAX_IN_FLIGHT  # requests answered at once; past it 503


class Json(Response):
    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return dumps(content)


def make_app(
    api: Api,
    hosts: frozenset[str] | None,
    *,
    max_in_flight: int = MAX_IN_FLIGHT,
    body_seconds: float = defaults.SERVE_REQUEST_TIMEOUT,  # a body not whole by then: 408
) -> ASGIApp:
    """The application: `hosts` the Host names answered (None: any), see guards.HostCheck."""

    @_answered
    async def search(request: Request) -> Response:
        _require_size(request)  # first: a body too large is not read, whatever it is
        _require_json_from_here(request)
        payload = _decode(await _read_body(request, body_seconds))
        return Json(await _unless_gone(request, api.search(payload)))

    @_answered
    async def models(request: Request) -> Response:
        return Json(await api.models())

    @_answered
    async def healthz(request: Request) -> Response:
        return Json(await api.health())

    @_answered
    async def metrics(request: Request) -> Response:
        return Json(api.metrics())

    @_answered
    async def home(request: Request) -> Response:
        try:
            specs = await api.served()
        except Exception as exc:  # the page loads anyway and says why it has no models
            return Response(page.render([], None, status_of(exc)[1]), media_type="text/html")
        names = [spec.name for spec in specs]
        default = page.default_model([(s.name, s.pooling) for s in specs], api.last_used)
        return Response(page.render(names, default), media_type="text/html")

    async def favicon(request: Request) -> Response:
        return Response(page.FAVICON, media_type="image/svg+xml")

    routes = [
        Route("/search", search, methods=["POST"]),
        Route("/models", models, methods=["GET"]),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/", home, methods=["GET"]),
        Route("/favicon.svg", favicon, methods=["GET"]),
    ]
    app = Starlette(
        routes=routes,
        exception_handlers={HTTPException: _http_error},
        lifespan=_lifespan(api),
    )
    app.router.redirect_slashes = False  # POST /search/ is a 404, not a 307 with no body
    return Guard(HostCheck(InFlightLimit(app, max_in_flight), hosts))


def _lifespan(api: Api) -> Callable[[Starlette], Any]:
    """The Api's pool opens with the server's event loop and closes with it."""

    @asynccontextmanager
    async def lifespan(app: Starlette) -> Any:
        await api.open()
        try:
            yield
        finally:
            await api.aclose()

    return lifespan


def _require_json_from_here(request: Request) -> None:
    kind = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if kind != "application/json":
        raise ApiError(
            415, "send the body as Content-Type: application/json (curl --json '{\"text\": ...}')"
        )
    # A browser that sends Sec-Fetch-Site says where the request comes from, behind a reverse
    # proxy too (whose Host is localhost); an older one is judged by its Origin.
    site = request.headers.get("sec-fetch-site")
    if site is not None:
        if site not in ("same-origin", "none"):
            raise ApiError(403, f"a {site} request from a web page is refused (Sec-Fetch-Site)")
        return
    origin = request.headers.get("origin")
    if origin is not None and origin.partition("://")[2] != request.headers.get("host", ""):
        raise ApiError(403, f"a request from another origin ({origin}) is refused")


def _require_size(request: Request) -> None:
    length = request.headers.get("content-length")
    if length is not None:
        try:
            size = int(length)
        except ValueError:
            size = -1
        if size < 0:
            raise ApiError(400, f"invalid Content-Length {length!r}")
        if size > MAX_BODY:
            raise ApiError(413, f"the body is larger than {MAX_BODY} bytes")


async def _read_body(request: Request, seconds: float) -> bytes:
    """The body, at most MAX_BODY bytes (a chunked one too), whole within `seconds`."""
    chunks: list[bytes] = []
    received = 0
    try:
        async with asyncio.timeout(seconds):
            async for chunk in request.stream():
                received += len(chunk)
                if received > MAX_BODY:
                    raise ApiError(413, f"the body is larger than {MAX_BODY} bytes")
                chunks.append(chunk)
    except TimeoutError:
        raise ApiError(
            408, f"the body did not arrive within {seconds:g} s (shorter than its Content-Length?)"
        ) from None
    except ClientDisconnect:
        raise ApiError(400, "the body ended before its Content-Length") from None
    return b"".join(chunks)


def _decode(body: bytes) -> object:
    try:
        return planner.loads_exact(body)
    except RecursionError:
        raise ApiError(400, "the body is not valid JSON: it is nested too deeply") from None
    except ValueError as exc:  # not UTF-8 (UnicodeDecodeError), not JSON (JSONDecodeError)
        raise ApiError(400, f"the body is not valid JSON: {exc}") from None


async def _http_error(request: Request, exc: Exception) -> Response:
    """Starlette's own: an unknown path (404), a known one with another method (405)."""
    assert isinstance(exc, HTTPException)
    path = request.url.path
    if exc.status_code == 404:
        return JsonError(404, f"no such endpoint {path!r}: see GET /, /models, /healthz")
    if exc.status_code == 405:
        allowed = (exc.headers or {}).get("Allow", "")
        methods = [m.strip() for m in allowed.split(",") if m.strip() not in ("HEAD", "")]
        return JsonError(405, f"{path} takes {' or '.join(methods)}", {"Allow": allowed})
    return JsonError(exc.status_code, str(exc.detail))


Endpoint = Callable[[Request], Awaitable[Response]]


def _answered(endpoint: Endpoint) -> Endpoint:
    """Every error of an endpoint as its status and one line (the log has a 500's traceback)."""

    async def answer(request: Request) -> Response:
        try:
            return await endpoint(request)
        except Exception as exc:
            status, message = status_of(exc)
            if status == 500 and not isinstance(exc, ApiError):
                log.error("%s %s failed", request.method, request.url.path, exc_info=exc)
            return JsonError(status, message)

    return answer


async def _unless_gone(request: Request, work: Awaitable[Any]) -> Any:
    """`work`'s result, or CancelledError for it as soon as the client goes away (its body is
    read: the next message is the disconnect): a search waiting for a batch leaves the queue."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(request.receive())
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:  # the server stopping: the search stops too
        task.cancel()
        raise
    finally:
        gone.cancel()
    if not task.done():
        task.cancel()
        raise ApiError(499, "the client went away")
    return task.result()
