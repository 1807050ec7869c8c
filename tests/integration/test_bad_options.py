"""Bad values from Python, where no click type checks them first: each is one line naming what is
wrong, raised before anything is registered, and a search's inputs of ordinary Python types
(numpy integers, dates, decimals) are taken as the CLI's would be."""

from __future__ import annotations

import datetime
import uuid
from decimal import Decimal
from typing import Any

import numpy as np
import psycopg
import pytest

import pgembed
from helpers import cli
from pgembed import db
from pgembed.catalog import registry
from pgembed.lifecycle import models

QUERY = "a sturdy kettle that boils fast"


def shadow_state(url: str) -> tuple[object, list[str]]:
    """The reindex in progress, if any, and the embedding columns of the table."""
    with db.connection(url) as conn:
        columns = conn.execute(
            "SELECT attname FROM pg_attribute WHERE attrelid = 'reviews'::regclass "
            "AND attname LIKE 'embedding%%' AND NOT attisdropped ORDER BY attname"
        ).fetchall()
        return registry.shadow(conn, "minilm"), [c[0] for c in columns]


@pytest.mark.parametrize(
    ("options", "said"),
    [
        ({"hnsw_m": 0}, "hnsw_m must be an integer from 2 to 100, not 0"),
        ({"hnsw_ef_construction": 2000}, "hnsw_ef_construction must be an integer from 4 to 1000"),
        ({"maintenance_work_mem": "lots"}, "maintenance_work_mem 'lots': invalid value for"),
        ({"maintenance_work_mem": "1kB"}, "maintenance_work_mem '1kB': 1 kB is outside the valid"),
        ({"parallel_workers": -1}, "parallel_workers must be an integer from 0 to 1024, not -1"),
        ({"claim_size": 0}, "claim_size must be an integer from 1 to 10000, not 0"),
        ({"lease_seconds": 0}, "lease_seconds must be a number of at least 1, not 0"),
        ({"device": "tpu"}, "invalid device 'tpu'"),
        ({"long_texts": "split"}, "long_texts must be one of 'truncate', 'chunk', not 'split'"),
        ({"max_seq_length": "12"}, "max_seq_length must be an integer of at least 1, not '12'"),
        ({"normalize": "no"}, "normalize must be True or False, not 'no'"),
        ({"wait": None}, "wait must be True or False, not None"),
    ],
)
def test_alter_model_refuses_a_bad_option_before_it_registers_a_version(
    shop_url: str, options: dict[str, Any], said: str
) -> None:
    before = shadow_state(shop_url)
    with pytest.raises(pgembed.UsageError, match=said) as caught:
        pgembed.alter_model("minilm", pooling="cls", database_url=shop_url, **options)
    assert "\n" not in str(caught.value)
    assert shadow_state(shop_url) == before == (None, ["embedding_minilm"])


@pytest.mark.parametrize(
    ("options", "said"),
    [
        ({"query_prefix": None}, "query_prefix must be a string, not None"),
        ({"document_prefix": None}, "document_prefix must be a string, not None"),
        ({"fulltext": "yes"}, "fulltext must be True or False, not 'yes'"),
        ({"normalize": 0}, "normalize must be True or False, not 0"),
        ({"max_seq_length": 12.5}, "max_seq_length must be an integer of at least 1, not 12.5"),
        ({"model": None}, "model must be a string, not None"),
        ({"column": None}, "column must be a column name or a list of them, not None"),
        ({"column": []}, r"column must be a column name or a list of them, not \[\]"),
        ({"table": 5}, "table must be a string, not 5"),
        ({"backfill": 1}, "backfill must be True or False, not 1"),
        ({"table": "pgembed.models"}, "pgembed.models is pgembed's own: a model watches a table"),
    ],
)
def test_add_model_refuses_a_value_of_the_wrong_type(
    shop_url: str, options: dict[str, Any], said: str
) -> None:
    given: dict[str, Any] = {"table": "reviews", "column": "product", **options}
    with pytest.raises(pgembed.UsageError, match=said):
        pgembed.add_model("other", database_url=shop_url, **given)
    assert [m["name"] for m in pgembed.status(shop_url)] == ["minilm"]


def test_a_view_on_the_column_is_named_before_a_reindex_or_removal_starts(shop_url: str) -> None:
    with db.connection(shop_url) as conn:
        conn.execute("CREATE VIEW everything AS SELECT * FROM reviews")
        with pytest.raises(pgembed.UsageError, match=r"view public\.everything read"):
            models.remove(conn, "minilm")
    with pytest.raises(pgembed.UsageError, match=r"a reindex of 'minilm' drops column"):
        pgembed.alter_model("minilm", pooling="cls", database_url=shop_url)
    assert shadow_state(shop_url) == (None, ["embedding_minilm"])
    # A chunked model's switch drops its chunk table too: a view on any of its columns counts.
    pgembed.add_model("windows", "reviews", "product", long_texts="chunk", database_url=shop_url)
    with db.connection(shop_url) as conn:
        conn.execute("DROP VIEW everything")
        conn.execute("CREATE VIEW windows AS SELECT key FROM pgembed_windows_chunks")
    with pytest.raises(pgembed.UsageError, match=r"drops table public\.pgembed_windows_chunks"):
        pgembed.alter_model("windows", pooling="cls", database_url=shop_url)
    assert [m["name"] for m in pgembed.status(shop_url)] == ["minilm", "windows"]


def test_a_view_made_during_a_reindex_stops_its_switch_which_resumes_once_it_is_gone(
    shop_url: str,
) -> None:
    shadow = pgembed.alter_model("minilm", pooling="cls", wait=False, database_url=shop_url)
    with db.connection(shop_url) as conn:
        conn.execute("CREATE VIEW everything AS SELECT * FROM reviews")
    stopped = cli("reindex", "minilm", "--database-url", shop_url)
    assert stopped.exit_code == 2, stopped.output
    assert "the switch of 'minilm' to version 2 drops column embedding_minilm" in stopped.output
    assert "view public.everything read" in stopped.output
    assert shadow_state(shop_url)[0] == shadow
    with db.connection(shop_url) as conn:
        conn.execute("DROP VIEW everything")
    resumed = cli("reindex", "minilm", "--database-url", shop_url)
    assert resumed.exit_code == 0, resumed.output
    with db.connection(shop_url) as conn:
        assert registry.get(conn, "minilm").pooling == "cls"
    assert shadow_state(shop_url) == (None, ["embedding_minilm"])


def test_search_takes_python_values_a_user_has_at_hand(shop_url: str) -> None:
    with db.connection(shop_url) as conn:
        conn.execute("ALTER TABLE reviews ADD COLUMN added date NOT NULL DEFAULT '2024-03-01'")
        conn.execute("ALTER TABLE reviews ADD COLUMN batch uuid")
        conn.execute("ANALYZE reviews")
    with pgembed.Client(shop_url) as client:
        plain = client.search("minilm", QUERY, k=5, filter={"rating": {"$gte": 4}})
        assert len(plain) == 5
        # numpy's integers (a k from an array's length, say) are taken as ints
        k, ef = np.int64(5), np.int32(80)
        assert client.search("minilm", QUERY, k=k, filter={"rating": {"$gte": 4}}) == plain  # type: ignore[arg-type]
        deep = client.search("minilm", QUERY, k=5, ef_search=ef)  # type: ignore[arg-type]
        assert deep == client.search("minilm", QUERY, k=5, ef_search=80)
        as_decimal = client.search("minilm", QUERY, k=5, filter={"rating": {"$gte": Decimal(4)}})
        assert as_decimal == plain
        day = datetime.date(2024, 3, 1)
        assert client.search("minilm", QUERY, k=5, filter={"added": day}) == client.search(
            "minilm", QUERY, k=5
        )
        later = datetime.datetime(2024, 3, 2, tzinfo=datetime.UTC)
        assert client.search("minilm", QUERY, filter={"added": {"$gte": later}}) == []
        assert client.search("minilm", QUERY, filter={"batch": uuid.uuid4()}) == []
        # An aware datetime is the instant it names (the helpers compare in UTC): 09:00 in Berlin
        # in winter is 08:00 UTC, after a row stamped 08:30 in a timestamp column.
        with db.connection(shop_url) as conn:
            conn.execute("ALTER TABLE reviews ADD COLUMN seen timestamp DEFAULT '2024-03-01 08:30'")
        berlin = datetime.timezone(datetime.timedelta(hours=1))
        nine = datetime.datetime(2024, 3, 1, 9, 0, tzinfo=berlin)
        assert client.search("minilm", QUERY, k=5, filter={"seen": {"$lt": nine}}) == []
        assert len(client.search("minilm", QUERY, k=5, filter={"seen": {"$gte": nine}})) == 5


@pytest.mark.parametrize(
    ("call", "said"),
    [
        ({"k": 10**12}, "k must be an integer from 1 to 2147483647, not 1000000000000"),
        ({"k": "5"}, r"k must be an integer from 1 to 2147483647, not '5'"),
        ({"ef_search": 0}, "ef_search must be an integer from 1 to 1000, not 0"),
        ({"ef_search": 40.5}, "ef_search must be an integer from 1 to 1000, not 40.5"),
        ({"filter": {"rating": {1, 2}}}, "a filter value must be a string, .* not set"),
        ({"filter": {"rating": float("nan")}}, "a filter value is NaN or infinite"),
        ({"filter": {"product": "a\x00"}}, "a filter value contains a NUL character"),
        ({"filter": {"product": "\udc80"}}, "a filter value is not valid Unicode"),
    ],
)
def test_bad_search_inputs_are_one_line_before_the_search(
    shop_url: str, call: dict[str, Any], said: str
) -> None:
    with pgembed.Client(shop_url) as client, pytest.raises(pgembed.UsageError, match=said):
        client.search("minilm", QUERY, **call)


def test_bad_names_keys_texts_and_urls_are_pgembed_errors(shop_url: str) -> None:
    with pgembed.Client(shop_url) as client:
        with pytest.raises(pgembed.UsageError, match="the model name must be a string, not 5"):
            client.search(5, QUERY)  # type: ignore[arg-type]
        with pytest.raises(pgembed.UsageError, match="out of range for type integer") as huge:
            client.similar("minilm", "1" * 200_000)
        assert len(str(huge.value)) < 200  # the server quotes the key whole: its start is kept

        with pytest.raises(pgembed.UsageError, match="the row key is not valid Unicode"):
            client.similar("minilm", "\udc80")
        with pytest.raises(pgembed.NotFoundError, match=r'has no row with id = "424242"$'):
            client.similar("minilm", 424242)
        with db.connection(shop_url) as conn:  # a text key: the message shows only its start
            conn.execute("CREATE TABLE notes (slug text PRIMARY KEY, body text)")
            conn.execute("INSERT INTO notes VALUES ('a', 'a note')")
        pgembed.add_model("notes", "notes", "body", precision="fp32", database_url=shop_url)
        with pytest.raises(pgembed.NotFoundError, match=r"has no row with slug = \"xxx") as gone:
            client.similar("notes", "x" * 2000)
        assert len(str(gone.value)) < 200
        with pytest.raises(pgembed.UsageError, match=r"takes strings: text 1 is NoneType"):
            client.embed("minilm", ["fine", None])  # type: ignore[list-item]
        with pytest.raises(pgembed.UsageError, match=r"takes a list of texts, not one bytes"):
            client.embed("minilm", b"abc")  # type: ignore[arg-type]
        with pytest.raises(pgembed.UsageError, match="text 0 is not valid Unicode"):
            client.embed("minilm", ["\udc80"])
        texts = ["a kettle", "a phone charger"]
        from_generator = client.embed("minilm", (text for text in texts))
        assert np.array_equal(from_generator, client.embed("minilm", texts))
        assert from_generator.shape == (2, 384)
    # An empty URL (an unset variable of the caller's) must not fall back on another database.
    with pytest.raises(pgembed.ConfigError, match="the database URL is empty"):
        pgembed.status("")
    with pytest.raises(pgembed.ConfigError, match="the database URL must be a string, not int"):
        pgembed.status(5)  # type: ignore[arg-type]
    for size in (0, "5"):
        with pytest.raises(pgembed.UsageError, match="max_connections must be an integer of"):
            pgembed.Client(shop_url, max_connections=size)  # type: ignore[arg-type]
    with psycopg.connect(shop_url) as conn:  # nothing changed on the way
        assert conn.execute("SELECT count(*) FROM pgembed.models").fetchone() == (2,)
