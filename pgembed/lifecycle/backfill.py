"""`model add --backfill`: embed a new model's existing rows first, then build its HNSW index.

pgvector builds an index over a filled column about three times faster than it inserts the same
vectors one by one, and a daemon's insertions take encode time on a machine with few cores
(BENCHMARKS.md, b/c). Until the index is built, searches on the model scan its column exactly.
"""

from __future__ import annotations

from pgembed import db
from pgembed.catalog import registry
from pgembed.catalog.registry import ModelSpec
from pgembed.errors import UsageError
from pgembed.lifecycle.reindex import Filling


class Backfill(Filling):
    """Fill the model's column with this process's worker (any `pgembed sync` helps), then build
    its index concurrently. Stopped, the rows stay queued for the daemons and `reindex
    --index-only` builds the index."""

    def run(self) -> ModelSpec | None:
        """The model with its rows embedded and its index built, or None when stopped."""
        with db.connection(self.url) as conn:
            spec = registry.get(conn, self.name)
        if spec.shadow_of is not None:
            raise UsageError(f"{self.name!r} is a reindex shadow: `pgembed reindex` fills it")
        if not self._fill(spec) or not self._build_index(spec):
            return None
        return spec
