"""Several columns, one text: `model add --column title --column body` embeds "title\\nbody"."""

from __future__ import annotations

import json

import numpy as np
import psycopg
import pytest

import pgembed
from helpers import cli, plans
from pgembed import db
from pgembed.catalog import registry
from pgembed.encode.settings import settings_of
from pgembed.sync import store

ROWS = [
    (1, "Battery", "It dies before lunch."),
    (2, "Apples", "Crisp, sweet and juicy."),
    (3, None, "The charger gets very hot."),
    (4, "Shipping", None),
]


@pytest.fixture
def products(conn: psycopg.Connection, db_url: str) -> psycopg.Connection:
    conn.execute(
        "CREATE TABLE public.products (id integer PRIMARY KEY, title varchar(200), body text, "
        "stars integer DEFAULT 3)"
    )
    with conn.cursor() as cur:
        cur.executemany("INSERT INTO products (id, title, body) VALUES (%s, %s, %s)", ROWS)
    result = cli(
        "--database-url", db_url, "model", "add", "minilm", "--table", "products",
        "--column", "title", "--column", "body", "--precision", "fp32", "--fulltext",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "products.title+body" in result.output
    return conn


def pending(conn: psycopg.Connection) -> list[str]:
    rows = conn.execute("SELECT key FROM pgembed.queue UNION SELECT key FROM pgembed.inbox")
    return sorted(key for (key,) in rows)


def test_the_columns_are_embedded_as_one_text(products: psycopg.Connection, db_url: str) -> None:
    assert pgembed.sync_once(database_url=db_url).written == 4
    spec = registry.get(products, "minilm")
    assert spec.text_columns == ("title", "body")
    settings = settings_of(spec)
    from pgembed.encode import embedder

    texts = ["Battery\nIt dies before lunch.", "\nThe charger gets very hot.", "Shipping\n"]
    expected = embedder.get(settings).encode_documents(texts)
    stored = [
        np.asarray(products.execute(
            "SELECT embedding_minilm FROM products WHERE id = %s", (key,)
        ).fetchone()[0].to_numpy())  # type: ignore[index]
        for key in (1, 3, 4)
    ]  # fmt: skip
    for got, want in zip(stored, expected, strict=True):
        assert float(np.dot(got, want)) > 0.9999
    # Hits carry the same text, searches and hybrid search find rows by either column.
    with pgembed.Client(db_url) as client:
        (hit,) = client.search("minilm", "phone battery", k=1)
        assert (hit.key, hit.text) == (1, "Battery\nIt dies before lunch.")
        hybrid = client.hybrid_search("minilm", "shipping", k=2)
    assert hybrid[0].key == 4


def test_hybrid_search_uses_the_full_text_index_of_the_joined_text(
    products: psycopg.Connection, db_url: str
) -> None:
    pgembed.sync_once(database_url=db_url)
    products.execute("SET enable_seqscan = off")
    vector = products.execute("SELECT embedding_minilm FROM products WHERE id = 1").fetchone()
    assert vector is not None
    with plans(products) as found:
        products.execute(
            "SELECT * FROM pgembed.hybrid_search('minilm', %s, 'juicy apples', 2)", vector
        )
    assert any("pgembed_minilm_fts" in plan for plan in found)


def test_an_update_of_any_text_column_and_only_those_re_embeds(
    products: psycopg.Connection, db_url: str
) -> None:
    pgembed.sync_once(database_url=db_url)
    products.execute("UPDATE products SET stars = 5")
    assert pending(products) == []
    products.execute("UPDATE products SET title = 'Battery life' WHERE id = 1")
    products.execute("UPDATE products SET body = 'Tart.' WHERE id = 2")
    assert pending(products) == ["1", "2"]
    both_gone = products.execute("SELECT embedding_minilm IS NULL FROM products WHERE id <= 2")
    assert [gone for (gone,) in both_gone] == [True, True]
    products.execute("UPDATE products SET title = NULL, body = ' ' WHERE id = 3")
    assert pending(products) == ["1", "2"]  # nothing left to embed in row 3


def test_the_md5_guard_covers_every_column(products: psycopg.Connection) -> None:
    spec = registry.get(products, "minilm")
    claims = store.claim(products, "minilm", "w1", 10, 60)
    rows = store.read(products, spec, [c.key for c in claims])
    products.execute("UPDATE products SET title = 'Changed in flight' WHERE id = 2")
    vectors = np.zeros((len(rows), spec.dimensions), dtype=np.float32)
    vectors[:, 0] = 1
    written = store.write(
        products, spec, [r.key for r in rows], [r.text_md5 for r in rows], vectors
    )
    assert "2" not in written and {"1", "3", "4"} <= written


def test_a_column_named_twice_is_one_clear_error(conn: psycopg.Connection, db_url: str) -> None:
    conn.execute("CREATE TABLE public.notes (id integer PRIMARY KEY, body text)")
    result = cli(
        "--database-url", db_url, "model", "add", "m", "--table", "notes",
        "--column", "body", "--column", "body",
    )  # fmt: skip
    assert result.exit_code == 2
    assert (
        result.output.strip().splitlines()[-1].endswith("a text column is named twice: body, body")
    )


def test_the_api_takes_several_columns(conn: psycopg.Connection, db_url: str) -> None:
    conn.execute("CREATE TABLE public.notes (id integer PRIMARY KEY, head text, body text)")
    spec = pgembed.add_model("m", "notes", ["head", "body"], precision="fp32", database_url=db_url)
    assert spec.text_columns == ("head", "body")
    again = pgembed.add_model(
        "m", "notes", ["head", "body"], precision="fp32", exist_ok=True, database_url=db_url
    )
    assert again == spec
    with db.connection(db_url) as other, pytest.raises(pgembed.UsageError, match="column"):
        del other
        pgembed.add_model("m", "notes", "body", exist_ok=True, database_url=db_url)


def test_status_reports_every_text_column(products: psycopg.Connection, db_url: str) -> None:
    result = cli("--database-url", db_url, "status", "--json")
    assert result.exit_code == 0, result.output
    report = next(m for m in json.loads(result.output) if m["name"] == "minilm")
    assert report["text_columns"] == ["title", "body"]
    assert (report["column"], report["columns"]) == ("title", ["title", "body"])  # earlier keys
    text = cli("--database-url", db_url, "status").output
    assert "on public.products.title+body" in text
