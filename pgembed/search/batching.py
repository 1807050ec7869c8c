"""Dynamic batching of query encoding for asyncio front ends (`pgembed serve`, AsyncClient).

Encoding one query at a time keeps a server at one encoder's rate however many clients wait:
each waits for all before it. Here the queries of one model's settings that arrive while its
encoder is busy wait in a queue, and when it is free they are encoded together as one batch (at
most `max_batch`, after waiting at most `max_wait` seconds for companions when the queue holds
fewer): a padded batch of 16 short queries costs a few single encodes, not 16. Each caller gets
its own vector; a text already cached (search/vectors.py) never waits, and the same text twice in
a queue is encoded once. A caller that stops waiting (its client went away: the task is
cancelled) is left out of the batch if it has not started. An error while encoding a batch (the
model cannot be loaded) is every caller's in it: they share the model.

The encoding itself runs in a thread, off the event loop; one batch at a time per settings.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from pgembed import defaults
from pgembed.catalog.registry import ModelSpec
from pgembed.encode import embedder
from pgembed.encode.embedder import Vectors
from pgembed.encode.settings import settings_of
from pgembed.search import vectors

log = logging.getLogger("pgembed.search")

MAX_BATCH = defaults.QUERY_BATCH  # queries in one batch at most
MAX_WAIT = defaults.QUERY_BATCH_WAIT  # seconds an idle encoder waits for a first query's company

Encode = Callable[[embedder.Settings, list[str]], list[Vectors]]


@dataclass
class BatchStats:
    """What the batcher did, for GET /metrics and the tests: queries encoded, batches run, the
    largest batch."""

    queries: int = 0
    batches: int = 0
    largest: int = 0
    cached: int = 0


@dataclass
class _Lane:
    """The queue of one settings' encoder."""

    waiting: list[tuple[str, asyncio.Future[Vectors]]] = field(default_factory=list)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None


class QueryBatcher:
    """Encodes the query texts of the tasks of one event loop in batches (see the module's
    docstring). `light`: encode with the light encoder where it applies (encode/light.py).
    `encode` replaces vectors.embed_queries (tests that hold an encode up)."""

    def __init__(
        self,
        max_batch: int = MAX_BATCH,
        max_wait: float = MAX_WAIT,
        *,
        light: bool = False,
        encode: Encode | None = None,
    ) -> None:
        if max_batch < 1 or max_wait < 0:
            raise ValueError("max_batch must be at least 1 and max_wait not negative")
        self.max_batch = max_batch
        self.max_wait = max_wait
        self.light = light
        self.stats = BatchStats()
        self._encode = encode or vectors.embed_queries
        self._lanes: dict[embedder.Settings, _Lane] = {}

    async def embed(self, spec: ModelSpec, text: str) -> Vectors:
        """The query vector of `text` with the model's settings, encoded in a batch."""
        settings = settings_of(spec)
        found = vectors.cached_query(settings, text)
        if found is not None:
            self.stats.cached += 1
            return found
        lane = self._lanes.get(settings)
        if lane is None:
            lane = self._lanes[settings] = _Lane()
        answer: asyncio.Future[Vectors] = asyncio.get_running_loop().create_future()
        lane.waiting.append((text, answer))
        lane.arrived.set()
        if lane.task is None or lane.task.done():
            lane.task = asyncio.create_task(self._run(settings, lane), name="pgembed-batcher")
        return await answer

    async def close(self) -> None:
        """Stop the lanes' tasks (those waiting get CancelledError)."""
        for lane in self._lanes.values():
            if lane.task is not None:
                lane.task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await lane.task
            for _, answer in lane.waiting:
                answer.cancel()
        self._lanes.clear()

    async def _run(self, settings: embedder.Settings, lane: _Lane) -> None:
        """Encode the lane's queue, batch after batch, until it is empty."""
        while lane.waiting:
            if len(lane.waiting) < self.max_batch and self.max_wait > 0:
                lane.arrived.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._filled(lane), self.max_wait)
            batch, lane.waiting = lane.waiting[: self.max_batch], lane.waiting[self.max_batch :]
            batch = [(text, answer) for text, answer in batch if not answer.done()]
            if batch:
                await self._answer(settings, batch)

    async def _filled(self, lane: _Lane) -> None:
        while len(lane.waiting) < self.max_batch:
            await lane.arrived.wait()
            lane.arrived.clear()

    async def _answer(
        self, settings: embedder.Settings, batch: list[tuple[str, asyncio.Future[Vectors]]]
    ) -> None:
        texts = list(dict.fromkeys(text for text, _ in batch))  # each distinct text once
        try:
            found = await asyncio.to_thread(self._encode_in_thread, settings, texts)
        except Exception as exc:  # every caller of the batch gets it: they share the model
            for _, answer in batch:
                if not answer.done():
                    answer.set_exception(exc)
            return
        by_text = dict(zip(texts, found, strict=True))
        self.stats.queries += len(texts)
        self.stats.batches += 1
        self.stats.largest = max(self.stats.largest, len(texts))
        for text, answer in batch:
            if not answer.done():
                answer.set_result(by_text[text])

    def _encode_in_thread(self, settings: embedder.Settings, texts: list[str]) -> list[Vectors]:
        if not self.light:
            return self._encode(settings, texts)
        with embedder.light_encoder():
            return self._encode(settings, texts)
