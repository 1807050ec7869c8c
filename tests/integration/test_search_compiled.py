"""pgembed.search is generated from the catalog: odd identifiers, concurrent changes, removal."""

from __future__ import annotations

import threading

import numpy as np
import psycopg
import pytest

from helpers import REVIEWS
from pgembed import db
from pgembed.encode import embedder
from pgembed.encode.settings import settings_of
from pgembed.lifecycle import models
from pgembed.sync import worker

# Legal identifiers (names.py accepts `$`) that would end a dollar-quoted function body early.
TABLE, TEXT, KEY = "Odd$body$Table", "Text$body$", "Key$fn$"


def test_identifiers_that_look_like_dollar_quotes(conn: psycopg.Connection, db_url: str) -> None:
    conn.execute(f'CREATE TABLE "{TABLE}" ("{KEY}" integer PRIMARY KEY, "{TEXT}" text)')
    with conn.cursor() as cur:
        cur.executemany(f'INSERT INTO "{TABLE}" VALUES (%s, %s)', list(REVIEWS))
    spec = models.add(conn, models.AddRequest("odd", TABLE, TEXT, precision="fp32"))[0]
    worker.Worker(db_url, worker.Options(once=True)).run()
    query = embedder.get(settings_of(spec)).encode_queries(["the battery died"])[0]
    hits = conn.execute(
        "SELECT key, similarity FROM pgembed.search('odd', %s, 3)", (query,)
    ).fetchall()
    conn.execute("SET enable_indexscan = off")  # exact: the same rows, in the same order
    plain = conn.execute(
        f'SELECT "{KEY}"::text, 1 - (embedding_odd <=> %s) FROM "{TABLE}" '
        "ORDER BY embedding_odd <=> %s LIMIT 3",
        (query, query),
    ).fetchall()
    assert [k for k, _ in hits] == [k for k, _ in plain]
    np.testing.assert_allclose([s for _, s in hits], [s for _, s in plain], atol=1e-6)


def test_concurrent_model_changes_each_rebuild_the_function(
    reviews: psycopg.Connection, db_url: str
) -> None:
    for i in range(3):
        reviews.execute(f"CREATE TABLE copy{i} AS SELECT * FROM reviews")
        reviews.execute(f"ALTER TABLE copy{i} ADD PRIMARY KEY (id)")
        models.add(reviews, models.AddRequest(f"m{i}", f"copy{i}", "body", precision="fp32"))
    worker.Worker(db_url, worker.Options(once=True)).run()
    # Two transactions change the catalog at once (as two `pgembed tune` runs would): the second
    # rebuild waits for the first to commit instead of failing with "tuple concurrently updated".
    with db.connection(db_url) as first, db.connection(db_url) as second:
        first.autocommit = second.autocommit = False
        first.execute("UPDATE pgembed.models SET ef_search = 50 WHERE name = 'm0'")
        # The rebuild is deferred to the commit; run the first one now, so that the second
        # transaction's commit finds it holding the rebuild lock.
        first.execute("SET CONSTRAINTS pgembed.recompile_search IMMEDIATE")
        errors: list[BaseException] = []

        def tune_m1() -> None:
            try:
                second.execute("UPDATE pgembed.models SET ef_search = 60 WHERE name = 'm1'")
                second.commit()
            except BaseException as exc:  # reported below, on the test thread
                errors.append(exc)

        thread = threading.Thread(target=tune_m1)
        thread.start()
        thread.join(1.0)
        assert thread.is_alive()  # its commit waits for the first rebuild's lock
        first.commit()
        thread.join()
        assert errors == []
    source = reviews.execute(
        "SELECT prosrc FROM pg_proc WHERE oid = 'pgembed.search'::regproc"
    ).fetchone()
    assert source is not None
    assert "_index_effort_v1('public.copy0', k, 50)" in source[0]
    assert "_index_effort_v1('public.copy1', k, 60)" in source[0]
    query = reviews.execute("SELECT embedding_m0 FROM copy0 WHERE id = 1").fetchone()
    assert query is not None
    for i in range(3):  # every model has its branch: the row itself comes first
        hits = reviews.execute(f"SELECT key FROM pgembed.search('m{i}', %s, 1)", query).fetchall()
        assert hits == [("1",)]
    models.remove(reviews, "m2")
    with pytest.raises(psycopg.errors.UndefinedObject, match="unknown model"):
        reviews.execute("SELECT * FROM pgembed.search('m2', %s, 1)", query)
    assert reviews.execute("SELECT key FROM pgembed.search('m1', %s, 1)", query).fetchall() == [
        ("1",)
    ]


def test_columns_named_like_the_functions_variables(conn: psycopg.Connection, db_url: str) -> None:
    conn.execute("CREATE TABLE asked (k integer PRIMARY KEY, query text, model text, ef text)")
    with conn.cursor() as cur:
        cur.executemany("INSERT INTO asked VALUES (%s, %s, 'x', 'y')", list(REVIEWS))
    models.add(conn, models.AddRequest("asked", "asked", "query", precision="fp32"))
    worker.Worker(db_url, worker.Options(once=True)).run()
    vector = conn.execute("SELECT embedding_asked FROM asked WHERE k = 3").fetchone()
    assert vector is not None
    hits = conn.execute("SELECT key FROM pgembed.search('asked', %s, 2)", vector).fetchall()
    assert hits[0] == ("3",) and len(hits) == 2


def test_settings_end_with_the_call_inside_a_transaction(
    reviews: psycopg.Connection, db_url: str
) -> None:
    models.add(reviews, models.AddRequest("minilm", "reviews", "body", precision="fp32"))
    reviews.execute("UPDATE pgembed.models SET ef_search = 60")
    worker.Worker(db_url, worker.Options(once=True)).run()
    vector = reviews.execute("SELECT embedding_minilm FROM reviews WHERE id = 1").fetchone()
    assert vector is not None
    settings = ("hnsw.ef_search", "hnsw.iterative_scan", "enable_seqscan", "plan_cache_mode")

    def shown() -> list[str]:
        return [str((reviews.execute(f"SHOW {s}").fetchone() or ("",))[0]) for s in settings]

    with reviews.transaction():
        assert shown() == ["40", "off", "on", "auto"]
        for filter in (None, '{"stars": 3}'):
            found = reviews.execute(
                "SELECT key FROM pgembed.search('minilm', %s, 3, %s)", (*vector, filter)
            ).fetchall()
            assert found[0] == ("1",)
            assert shown() == ["40", "off", "on", "auto"]
        reviews.execute("SET LOCAL hnsw.ef_search = 25")
        reviews.execute("SET LOCAL hnsw.iterative_scan = relaxed_order")
        reviews.execute("SELECT * FROM pgembed.search('minilm', %s, 3)", vector).fetchall()
        assert shown() == ["25", "relaxed_order", "on", "auto"]
