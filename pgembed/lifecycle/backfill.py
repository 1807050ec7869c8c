"""`model add --backfill`: embed a new model's existing rows first, then build its HNSW index.

The server builds an index over a filled column in a fifth to a sixth of the time it spends
inserting the same vectors one by one (2,000 and 20,000 rows; BENCHMARKS.md, "HNSW insertions or
one build"). Until the index is built, searches on the model scan its column exactly. A chunked
model's window table keeps its own index from the start.
"""

from __future__ import annotations

from pgembed import db
from pgembed.catalog import ddl, naming, registry
from pgembed.catalog.registry import ModelSpec
from pgembed.errors import UsageError
from pgembed.lifecycle.reindex import Filling


class Backfill(Filling):
    """Fill the model's column with this process's worker (any `pgembed sync` helps), build its
    index concurrently, then embed the rows changed meanwhile. Stopped before the index is
    built, the rows stay queued for the daemons and `reindex --index-only` builds the index."""

    def run(self) -> ModelSpec | None:
        """The model with its index built, or None when stopped before that. A stop after the
        build leaves the last changed rows to the daemons (`progress` says how many)."""
        with db.connection(self.url) as conn:
            spec = registry.get(conn, self.name)
        if spec.shadow_of is not None:
            raise UsageError(f"{self.name!r} is a reindex shadow: `pgembed reindex` fills it")
        if not self._fill(spec):
            return None
        if not self._build_index(spec):
            self._drop_unfinished(spec)
            return None
        self._fill(spec)  # rows changed while the index was built were queued again
        return spec

    def _drop_unfinished(self, spec: ModelSpec) -> None:
        """A cancelled concurrent build leaves an invalid index that every write still updates."""
        name = naming.index_name(spec)
        with db.connection(self.url) as conn:
            if ddl.index_valid(conn, spec.table_schema, name) is False:
                ddl.drop_concurrently(conn, spec.table_schema, name)
