"""The public Python API a web application uses: migrate, add, sync and status as functions and
Client methods; keys in their own type; errors that need no model before it loads; one Client
shared by many threads over a pool."""

from __future__ import annotations

import gc
import json
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import psycopg
import pytest

import pgembed
from helpers import REVIEWS, cli, database_name
from pgembed import db, migrate
from pgembed.encode import embedder
from pgembed.encode.settings import settings_of
from pgembed.search import vectors

QUERY = "phone battery does not last the day"
VOLATILE = {"lag_seconds", "oldest_queued_seconds", "rows_per_second", "workers"}


def stable(report: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A status report without what moves by itself (lag, throughput, heartbeats), as JSON."""
    found: list[dict[str, Any]] = json.loads(json.dumps(report))
    return [{k: v for k, v in entry.items() if k not in VOLATILE} for entry in found]


def test_migrate_add_sync_and_status_as_functions(empty_db_url: str) -> None:
    url = empty_db_url
    with pytest.raises(pgembed.SchemaError, match="run `pgembed migrate`"):
        pgembed.status(url)
    applied = pgembed.migrate_schema(url)
    definitions = [d.filename for d in migrate.definitions()]
    assert applied == [m.filename for m in migrate.available()] + definitions
    assert pgembed.migrate_schema(url) == []
    with db.connection(url) as conn:
        conn.execute("CREATE TABLE notes (id bigint PRIMARY KEY, body text)")
        conn.cursor().executemany("INSERT INTO notes VALUES (%s, %s)", REVIEWS)
    spec = pgembed.add_model("notes", "notes", "body", precision="fp32", database_url=url)
    assert isinstance(spec, pgembed.ModelSpec)
    assert (spec.qualified_table, spec.text_column, spec.key_column) == (
        "public.notes",
        "body",
        "id",
    )
    [before] = pgembed.status(url)
    assert (before["queued"], before["rows_embedded"]) == (len(REVIEWS), 0)

    result = pgembed.sync_once(database_url=url)
    assert result == pgembed.SyncResult(written=len(REVIEWS), skipped=0, failed=0)
    report = pgembed.status(url)
    assert (report[0]["rows_embedded"], report[0]["queued"]) == (len(REVIEWS), 0)
    printed = cli("--database-url", url, "status", "--json")
    assert stable(json.loads(printed.output)) == stable(report)  # what `status --json` prints
    assert pgembed.sync_once("notes", url) == pgembed.SyncResult(0, 0, 0)

    # An application may register its model at every start, and is told when a model of that
    # name is not the one it asks for.
    assert pgembed.add_model("notes", "notes", "body", exist_ok=True, database_url=url) == spec
    with pytest.raises(pgembed.UsageError, match="model 'notes' already exists"):
        pgembed.add_model("notes", "notes", "body", database_url=url)
    with pytest.raises(pgembed.UsageError, match="pooling 'mean', not 'cls'"):
        pgembed.add_model("notes", "notes", "body", pooling="cls", exist_ok=True, database_url=url)
    with pytest.raises(pgembed.UsageError, match="precision 'fp32', not 'int8'"):
        pgembed.add_model(
            "notes", "notes", "body", precision="int8", exist_ok=True, database_url=url
        )
    # fulltext asked for later: the index is built, the model is the same.
    again = pgembed.add_model(
        "notes", "notes", "body", fulltext=True, exist_ok=True, database_url=url
    )
    assert again == spec
    with pgembed.Client(url) as client:
        assert client.hybrid_search("notes", "apple pie", k=1)[0].key == 7
    with pytest.raises(pgembed.NotFoundError, match="unknown model 'ghost'"):
        pgembed.sync_once(["ghost"], url)
    with pgembed.Client(url) as client:
        assert [h.key for h in client.search("notes", "apple pie", k=1)] == [7]


def test_add_and_alter_take_every_option_of_the_cli(db_url: str) -> None:
    # long_texts and backfill (model add's --long-texts, --backfill), then alter_model.
    long_text = " ".join(f"word{i} battery charger screen" for i in range(150))  # > 1 window
    with db.connection(db_url) as conn:
        conn.execute("CREATE TABLE notes (id bigint PRIMARY KEY, body text)")
        conn.cursor().executemany("INSERT INTO notes VALUES (%s, %s)", [*REVIEWS, (99, long_text)])
    spec = pgembed.add_model(
        "notes",
        "notes",
        "body",
        precision="fp32",
        long_texts="chunk",
        backfill=True,
        database_url=db_url,
    )
    assert spec.chunked
    [report] = pgembed.status(db_url)
    # Embedded in the call itself (no sync), then its index built over the rows.
    assert (report["rows_embedded"], report["queued"], report["index"]) == (
        len(REVIEWS) + 1,
        0,
        "built",
    )
    with db.connection(db_url) as conn:
        row = conn.execute("SELECT count(*) FROM pgembed_notes_chunks WHERE key = '99'").fetchone()
        assert row is not None and row[0] >= 1  # the long text's later windows
    with pytest.raises(pgembed.UsageError, match="long_texts 'chunk', not 'truncate'"):
        pgembed.add_model("notes", "notes", "body", exist_ok=True, database_url=db_url)

    shadow = pgembed.alter_model("notes", long_texts="truncate", wait=False, database_url=db_url)
    assert (shadow.shadow_of, shadow.version, shadow.chunked) == ("notes", 2, False)
    with (
        pgembed.Client(db_url) as client,
        pytest.raises(pgembed.UsageError, match="already has a reindex"),
    ):
        client.alter_model("notes", hnsw_m=8)  # the Client's method, on the same database
    cli("--database-url", db_url, "reindex", "notes")
    altered = pgembed.alter_model("notes", hnsw_m=8, claim_size=16, database_url=db_url)
    assert (altered.version, altered.hnsw_m, altered.chunked) == (3, 8, False)
    with pgembed.Client(db_url) as client:
        assert client.search("notes", "apples", k=1)[0].key == 3


def test_a_mistyped_model_gets_did_you_mean_everywhere(shop_url: str) -> None:
    hint = "unknown model 'minlm': did you mean 'minilm'? (see `pgembed model list`)"
    with pgembed.Client(shop_url) as client:  # the planner's lookup
        with pytest.raises(pgembed.NotFoundError) as found:
            client.search("minlm", "battery")
        assert str(found.value) == hint
        with pytest.raises(pgembed.NotFoundError, match="did you mean 'minilm'"):
            client.embed("minlm", ["battery"])
    with pytest.raises(pgembed.NotFoundError, match="did you mean 'minilm'"):
        pgembed.sync_once("minlm", shop_url)  # the catalog's own lookup (registry.get)
    for args in (
        ["query", "battery", "--model", "minlm"],
        ["sync", "--once", "--model", "minlm"],
        ["model", "remove", "minlm"],
        ["model", "alter", "minlm", "--pooling", "cls"],
    ):
        result = cli("--database-url", shop_url, *args)
        assert (result.exit_code, result.output.strip()) == (1, f"pgembed: error: {hint}"), args


def test_the_same_as_client_methods(shop_url: str) -> None:
    with pgembed.Client(shop_url) as client:
        assert client.migrate_schema() == []
        assert stable(client.status()) == stable(pgembed.status(shop_url))
        spec = client.add_model("minilm", "reviews", "text", exist_ok=True, fulltext=True)
        assert spec.name == "minilm" and spec.dimensions == 384
        with psycopg.connect(shop_url, autocommit=True) as conn:
            conn.execute("UPDATE reviews SET text = 'Crisp apples, sweet as honey.' WHERE id = 5")
        assert client.sync_once(["minilm"]) == pgembed.SyncResult(1, 0, 0)
        assert client.search("minilm", "sweet honey apples", k=1)[0].key == 5


def test_keys_come_back_in_the_key_columns_own_type(db_url: str) -> None:
    ids = {uuid.UUID(int=i) for i, _ in REVIEWS}
    with db.connection(db_url) as conn:
        conn.execute("CREATE TABLE by_uuid (id uuid PRIMARY KEY, body text)")
        conn.execute("CREATE TABLE by_code (code text PRIMARY KEY, body text)")
        for i, text in REVIEWS:
            conn.execute("INSERT INTO by_uuid VALUES (%s, %s)", (uuid.UUID(int=i), text))
            conn.execute("INSERT INTO by_code VALUES (%s, %s)", (f"R-{i}", text))
    for name in ("by_uuid", "by_code"):
        pgembed.add_model(name, name, "body", precision="fp32", fulltext=True, database_url=db_url)
    pgembed.sync_once(database_url=db_url)
    with pgembed.Client(db_url) as client:
        by_uuid = client.search("by_uuid", QUERY, k=3)
        assert all(isinstance(h.key, uuid.UUID) for h in by_uuid) and {h.key for h in by_uuid} < ids
        assert client.similar("by_uuid", by_uuid[0].key, k=1)[0].key != by_uuid[0].key
        hybrid = client.hybrid_search("by_uuid", "apples", k=1)
        assert isinstance(hybrid[0].key, uuid.UUID)
        assert client.search("by_code", "crushed box", k=1)[0].key == "R-5"
    printed = cli(
        "--database-url", db_url, "query", QUERY, "--model", "by_uuid", "-k", "3", "--json"
    )
    assert printed.exit_code == 0, printed.output
    assert [h["key"] for h in json.loads(printed.output)] == [str(h.key) for h in by_uuid]


def test_errors_that_need_no_model_come_before_it_loads(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with db.connection(db_url) as conn:
        conn.execute("CREATE TABLE docs (id int PRIMARY KEY, body text)")
        conn.execute("INSERT INTO docs VALUES (1, 'The battery dies before lunch')")
    # Settings no other test uses (the query prefix), so nothing else loads this model.
    spec = pgembed.add_model("cold", "docs", "body", query_prefix="cold: ", database_url=db_url)
    settings = settings_of(spec)
    embedder._cache.pop(settings, None)  # add_model loaded it to check it: unload it again
    assert settings not in vectors.warm
    # The evidence: every model is had through embedder.get (loaded on its first call).
    asked: list[embedder.Settings] = []
    get = embedder.get

    def recorded(wanted: embedder.Settings) -> embedder.Embedder:
        asked.append(wanted)
        return get(wanted)

    monkeypatch.setattr(embedder, "get", recorded)

    def query(*args: str) -> tuple[int, str]:
        result = cli("--database-url", db_url, "query", *args)
        return result.exit_code, result.output.strip()

    empty = "pgembed: error: the query text is empty"
    assert query("", "--model", "cold") == (2, empty)
    assert query("  \n", "--model", "cold", "--hybrid") == (2, empty)
    assert query("x", "--model", "ghost") == (
        1,
        "pgembed: error: unknown model 'ghost': see `pgembed model list`",
    )
    no_index = "model cold has no full-text index: run `pgembed model fulltext cold`"
    no_vectors = "model 'cold' has no vectors yet: run `pgembed sync`"
    assert query("x", "--model", "cold", "--hybrid") == (1, f"pgembed: error: {no_index}")
    assert query("x", "--model", "cold") == (1, f"pgembed: error: {no_vectors}")
    with pgembed.Client(db_url) as client:
        with pytest.raises(pgembed.UsageError, match="the query text is empty"):
            client.search("cold", " ")
        with pytest.raises(pgembed.NotFoundError, match="no full-text index"):
            client.hybrid_search("cold", "x")
        with pytest.raises(pgembed.NotFoundError, match="no vectors yet"):
            client.search("cold", "x")
        assert settings not in asked and settings not in embedder._cache  # no model loaded

        # Once it is loaded (the evidence above would show it), a search asks no extra question
        # first, and the answers are the same.
        client.embed("cold", ["x"], queries=True)
        assert settings in asked and settings in embedder._cache
        vectors.embed_query(spec, "warm")
        assert settings in vectors.warm
        with pytest.raises(pgembed.NotFoundError, match=no_index):
            client.hybrid_search("cold", "y")
        with pytest.raises(pgembed.NotFoundError, match=no_vectors):
            client.search("cold", "y")


def pool_threads() -> list[threading.Thread]:
    """The threads of pgembed's connection pools (psycopg_pool names them after the pool)."""
    return [
        t
        for t in threading.enumerate()
        if t.name.startswith(("pgembed-scheduler", "pgembed-worker"))
    ]


def connections(url: str, settled: int | None = None) -> int:
    """The other sessions on the database; with `settled`, waits (5 s at most) for that many: a
    closed connection's server process takes a moment to leave pg_stat_activity."""
    deadline = time.monotonic() + 5
    with db.connection(url) as conn:
        while True:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE datname = %s AND pid <> pg_backend_pid()",
                (database_name(url),),
            ).fetchone()
            count = row[0] if row else 0
            if settled is None or count == settled or time.monotonic() > deadline:
                return count
            time.sleep(0.05)


def test_many_threads_share_one_client_over_a_pool(shop_url: str) -> None:
    texts = [f"{QUERY} #{i % 5}" for i in range(64)]
    client = pgembed.Client(shop_url, max_connections=3)
    assert pool_threads() == [] and connections(shop_url) == 0  # nothing until the first call
    expected = {t: client.search("minilm", t, k=3) for t in set(texts)}
    with ThreadPoolExecutor(max_workers=16) as threads:
        got = list(threads.map(lambda t: client.search("minilm", t, k=3), texts))
        hybrid = list(threads.map(lambda t: client.hybrid_search("minilm", t, k=2), texts[:16]))
        similar = list(threads.map(lambda key: client.similar("minilm", key, k=2), range(1, 17)))
    assert got == [expected[t] for t in texts]
    assert all(len(h) == 2 for h in hybrid) and all(len(s) == 2 for s in similar)
    assert 1 <= connections(shop_url) <= 3
    assert pool_threads()
    client.close()
    assert pool_threads() == [] and connections(shop_url, settled=0) == 0
    with pytest.raises(pgembed.UsageError, match="closed"):
        client.search("minilm", QUERY)

    dropped = pgembed.Client(shop_url)
    assert len(dropped.search("minilm", QUERY, k=1)) == 1
    del dropped
    gc.collect()  # a Client dropped without close() closes its pool and stops its threads
    assert pool_threads() == [] and connections(shop_url, settled=0) == 0


def test_vectors_from_embed_search_through_plain_psycopg(shop_url: str) -> None:
    # What docs/python.md shows: your own connection needs pgvector's types registered.
    from pgvector.psycopg import register_vector

    with pgembed.Client(shop_url) as client:
        query = client.embed("minilm", [QUERY], queries=True)[0]
        hits = client.search("minilm", QUERY, k=3)
    with psycopg.connect(shop_url) as conn:
        register_vector(conn)
        rows = conn.execute(
            "SELECT key, similarity FROM pgembed.search('minilm', %s, 3)", (query,)
        ).fetchall()
    assert [int(key) for key, _ in rows] == [h.key for h in hits]
    np.testing.assert_allclose([s for _, s in rows], [h.similarity for h in hits], atol=1e-6)


def terminate_others(url: str) -> int:
    """End every other session on the database, as a server restart would."""
    with db.connection(url) as conn:
        ended = conn.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = %s AND pid <> pg_backend_pid()",
            (database_name(url),),
        ).fetchone()
    return ended[0] if ended else 0


def test_connections_dead_since_their_last_use_cost_no_error(shop_url: str) -> None:
    with pgembed.Client(shop_url, max_connections=3) as client:
        expected = client.search("minilm", QUERY, k=3)
        with ThreadPoolExecutor(max_workers=6) as threads:  # several idle connections
            list(threads.map(lambda _: client.search("minilm", QUERY, k=3), range(24)))
        assert terminate_others(shop_url) >= 1
        assert client.search("minilm", QUERY, k=3) == expected
        assert client.status()[0]["rows_embedded"] == 324
