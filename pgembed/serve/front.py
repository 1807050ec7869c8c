"""What uvicorn has no setting for, done in front of it with public asyncio and h11 APIs: a
connection's request head must be whole within a time limit (408, or closed if nothing came),
and a head that cannot be parsed gets a JSON 400, not uvicorn's plain text.

`Front` is an asyncio.Protocol around the one uvicorn makes for each connection (uvicorn's
protocol is used only through asyncio's Protocol interface, never subclassed or looked into). It
reads the bytes with an h11 connection of its own to know where each request's head ends, and
gives uvicorn a head only once it is whole and valid, so uvicorn never sees a partial or broken
one. `FrontLoop` is the event loop that puts a Front around every protocol uvicorn's server
makes (uvicorn calls the loop's `create_server`). `Answered` is the ASGI middleware that tells
a connection's Front when uvicorn has sent an answer, so a 400 or 408 of the Front's own is
written only after the answers before it (a client that sent requests ahead of the answers).
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any, cast

import h11
from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger("pgembed.serve")

HEAD_BYTES = 16 * 1024  # h11's default bound on a head still incomplete; uvicorn gets it too
Peer = tuple[str, int]  # a connection's remote address, as in an ASGI scope's "client"
Fronts = dict[Peer, "Front"]


class Front(asyncio.Protocol):
    """One connection: the bytes of a request head are held until the head is whole (then
    uvicorn gets them) or `seconds` pass from its first byte (from the connection's start, for
    its first request), when it is answered 408 and closed; a connection that sent nothing is
    closed without an answer. Body bytes go to uvicorn as they come."""

    def __init__(self, inner: asyncio.Protocol, fronts: Fronts, seconds: float) -> None:
        self.inner = inner
        self.fronts = fronts
        self.seconds = seconds
        self.reader = h11.Connection(h11.SERVER, max_incomplete_event_size=HEAD_BYTES)
        self.held = bytearray()  # received, not yet given to uvicorn
        self.unanswered = 0  # requests given to uvicorn whose answer is not out yet
        self.refusal: bytes | None = None  # our answer, once the ones before it are out
        self.through = False  # past what the reader follows (Connection: close): all to uvicorn
        self.timer: asyncio.TimerHandle | None = None
        self.transport: asyncio.Transport | None = None
        self.peer: Peer | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        peer = transport.get_extra_info("peername")
        if isinstance(peer, tuple):
            self.peer = (str(peer[0]), int(peer[1]))
            self.fronts[self.peer] = self
        self.inner.connection_made(transport)
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if self.peer is not None and self.fronts.get(self.peer) is self:
            del self.fronts[self.peer]
        self.inner.connection_lost(exc)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()

    def data_received(self, data: bytes) -> None:
        if self.refusal is not None:
            return
        if self.through:
            self.inner.data_received(data)
            return
        self.held += data
        self.reader.receive_data(data)
        self._read()

    def answered(self) -> None:
        """uvicorn has sent the answer to one of the requests it was given."""
        self.unanswered -= 1
        if self.unanswered <= 0 and self.refusal is not None:
            self._send_refusal()
        elif self.unanswered <= 0 and self.held and not self.through:
            self._arm()  # a head that waited behind the answers: its time starts now

    def _read(self) -> None:
        while True:
            in_head = self.reader.their_state is h11.IDLE
            try:
                event = self.reader.next_event()
            except h11.RemoteProtocolError as exc:
                if in_head:  # ours to answer
                    reason = str(exc).split(": bytearray(", 1)[0]  # not the bytes again
                    log.info("a request that cannot be read: %s", reason)
                    self._refuse(400, f"invalid HTTP request: {reason}")
                else:  # the body's framing: uvicorn sees and answers it as well
                    self._pass_through()
                return
            if isinstance(event, h11.Request):
                self._disarm()
                self.unanswered += 1
                self._give(len(self.held) - len(self.reader.trailing_data[0]))
            elif isinstance(event, h11.EndOfMessage):
                self._give(len(self.held) - len(self.reader.trailing_data[0]))
                if not self._next_cycle():
                    return
            elif event is h11.NEED_DATA:
                if self.reader.their_state is not h11.IDLE:
                    self._give(len(self.held))  # the body so far
                elif self.held and self.unanswered <= 0:  # else: armed once they are answered
                    self._arm()
                return
            elif not isinstance(event, h11.Data):  # PAUSED, ConnectionClosed
                self._pass_through()
                return

    def _next_cycle(self) -> bool:
        """The reader answers for itself (a response of no consequence, never sent) to read the
        next request; False where HTTP has no next one (Connection: close, HTTP/1.0)."""
        try:
            # Not a 2xx: to CONNECT, h11 takes a 2xx for a switch of protocol and would stop
            # reading (and the head's deadline with it) on a connection uvicorn keeps open.
            self.reader.send(h11.Response(status_code=404, headers=[(b"content-length", b"0")]))
            self.reader.send(h11.EndOfMessage())
            self.reader.start_next_cycle()
        except h11.LocalProtocolError:
            self._pass_through()
            return False
        return True

    def _give(self, size: int) -> None:
        if size > 0:
            chunk = bytes(self.held[:size])
            del self.held[:size]
            self.inner.data_received(chunk)

    def _pass_through(self) -> None:
        self.through = True
        self._disarm()
        self._give(len(self.held))

    def _arm(self) -> None:
        if self.timer is None and self.transport is not None:
            self.timer = asyncio.get_running_loop().call_later(self.seconds, self._timed_out)

    def _disarm(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _timed_out(self) -> None:
        self.timer = None
        if self.held:
            said = f"the request's headers did not arrive within {self.seconds:g} s"
            self._refuse(408, said)
        elif self.unanswered <= 0 and self.transport is not None:
            self.transport.close()  # nothing came: no answer

    def _refuse(self, status: int, message: str) -> None:
        """Answer `status` and close: at once, or once the answers before it are out."""
        self._disarm()
        self.held.clear()
        body = json.dumps({"error": message}).encode()
        reason = {400: b"Bad Request", 408: b"Request Timeout"}[status]
        self.refusal = b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\n" % (status, reason)
        self.refusal += b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(body), body)
        if self.transport is not None:
            self.transport.pause_reading()
        if self.unanswered <= 0:
            self._send_refusal()

    def _send_refusal(self) -> None:
        if self.transport is not None and self.refusal is not None:
            if not self.transport.is_closing():
                self.transport.write(self.refusal)
            self.transport.close()


class FrontLoop(asyncio.SelectorEventLoop):
    """asyncio's event loop, whose servers put a Front around each connection's protocol."""

    def __init__(self, fronts: Fronts, seconds: float) -> None:
        super().__init__()
        self.fronts = fronts
        self.seconds = seconds

    async def create_server(
        self, protocol_factory: Any, *args: Any, **kwargs: Any
    ) -> asyncio.Server:
        def front() -> Front:
            return Front(protocol_factory(), self.fronts, self.seconds)

        return await super().create_server(front, *args, **kwargs)


class Answered:
    """ASGI middleware, outermost: tells the request's connection (found by its "client"
    address) when its answer has been sent."""

    def __init__(self, app: ASGIApp, fronts: Fronts) -> None:
        self.app = app
        self.fronts = fronts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        client = scope.get("client")
        front = self.fronts.get((client[0], client[1])) if client else None
        if scope["type"] != "http" or front is None:
            await self.app(scope, receive, send)
            return

        async def sent(message: Message) -> None:
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body"):
                front.answered()

        await self.app(scope, receive, sent)
