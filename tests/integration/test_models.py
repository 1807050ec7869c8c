from __future__ import annotations

import json
from typing import Any

import numpy as np
import psycopg
import pytest
import torch
from transformers import AutoModel, AutoTokenizer

from helpers import cli
from pgembed import roles
from pgembed.catalog import naming, registry
from pgembed.encode import embedder
from pgembed.encode.settings import settings_of
from pgembed.errors import ModelLoadError, NotFoundError, UsageError
from pgembed.lifecycle import models


def add(conn: psycopg.Connection, name: str = "minilm", **kw: Any) -> registry.ModelSpec:
    request = models.AddRequest(
        name=name, table=str(kw.pop("table", "reviews")), column=str(kw.pop("column", "body")), **kw
    )
    return models.add(conn, request)[0]


def columns(conn: psycopg.Connection, table: str = "reviews") -> dict[str, str]:
    return dict(
        conn.execute(
            "SELECT column_name, udt_name FROM information_schema.columns WHERE table_name = %s",
            (table,),
        ).fetchall()
    )


def test_add_creates_column_index_triggers_and_queues_rows(reviews: psycopg.Connection) -> None:
    spec, queued = models.add(reviews, models.AddRequest("minilm", "reviews", "body"))
    assert queued == 8
    assert (spec.key_column, spec.pooling, spec.dimensions, spec.max_seq_length) == (
        "id",
        "mean",
        384,
        256,
    )
    assert columns(reviews)["embedding_minilm"] == "vector"
    typmod = reviews.execute(
        "SELECT format_type(atttypid, atttypmod) FROM pg_attribute "
        "WHERE attrelid = 'reviews'::regclass AND attname = 'embedding_minilm'"
    ).fetchone()
    assert typmod == ("vector(384)",)
    indexdef = reviews.execute(
        "SELECT indexdef FROM pg_indexes WHERE indexname = 'pgembed_minilm_hnsw'"
    ).fetchone()
    assert indexdef and "hnsw" in indexdef[0] and "vector_cosine_ops" in indexdef[0]
    triggers = {
        r[0]
        for r in reviews.execute(
            "SELECT tgname FROM pg_trigger WHERE tgrelid = 'reviews'::regclass AND NOT tgisinternal"
        )
    }
    assert triggers == {f"pgembed_minilm_{e}" for e in ("ins", "upd", "del", "trunc", "vec")}
    assert reviews.execute(
        "SELECT count(*) FROM pgembed.queue WHERE model = 'minilm'"
    ).fetchone() == (8,)


def test_same_checkpoint_two_poolings_are_two_spaces(reviews: psycopg.Connection) -> None:
    mean = add(reviews, "minilm")
    cls = add(reviews, "minilm_cls", pooling="cls")
    assert (mean.pooling, cls.pooling) == ("mean", "cls")
    cols = columns(reviews)
    assert cols["embedding_minilm"] == cols["embedding_minilm_cls"] == "vector"
    names = {
        r[0]
        for r in reviews.execute("SELECT indexname FROM pg_indexes WHERE tablename = 'reviews'")
    }
    assert {"pgembed_minilm_hnsw", "pgembed_minilm_cls_hnsw"} <= names


def _reference(texts: list[str], pooling: str) -> np.ndarray:
    """Pooling computed by hand from the checkpoint's token states, as the issue defines it."""
    path = embedder.resolve("all-MiniLM-L6-v2")
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModel.from_pretrained(path).eval()
    batch = tokenizer(texts, padding=True, truncation=True, max_length=256, return_tensors="pt")
    with torch.no_grad():
        states = model(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).float()
    if pooling == "cls":
        pooled = states[:, 0]
    elif pooling == "mean":
        pooled = (states * mask).sum(1) / mask.sum(1)
    else:
        pooled = states.masked_fill(mask == 0, -1e9).max(1).values
    return torch.nn.functional.normalize(pooled, dim=-1).numpy()


@pytest.mark.parametrize("pooling", ["mean", "cls", "max"])
def test_pooling_matches_its_definition(pooling: str) -> None:
    texts = ["The battery dies fast.", "Crisp apples from the orchard, sweet and fresh."]
    ours = embedder.get(embedder.Settings("all-MiniLM-L6-v2", pooling=pooling)).encode_documents(
        texts
    )
    np.testing.assert_allclose(ours, _reference(texts, pooling), atol=1e-4)


def test_pooling_changes_vectors_and_default_is_the_checkpoints() -> None:
    text = ["Charger overheats after a week."]
    default = embedder.get(embedder.Settings("all-MiniLM-L6-v2"))
    assert default.info.pooling == "mean"
    cls = embedder.get(embedder.Settings("all-MiniLM-L6-v2", pooling="cls"))
    cosine = float(default.encode_documents(text)[0] @ cls.encode_documents(text)[0])
    assert cosine < 0.95


def test_no_normalize_and_max_seq_length(reviews: psycopg.Connection) -> None:
    spec = add(reviews, "raw", normalize=False, max_seq_length=16)
    assert (spec.normalize, spec.max_seq_length) == (False, 16)
    vec = embedder.get(settings_of(spec)).encode_documents(["a fairly ordinary sentence"])
    assert abs(float(np.linalg.norm(vec[0])) - 1.0) > 0.01


def test_key_defaults_to_primary_key_and_table_without_one_is_refused(
    conn: psycopg.Connection,
) -> None:
    conn.execute("CREATE TABLE nokey (id int, body text)")
    with pytest.raises(UsageError, match="has no primary key"):
        add(conn, table="nokey")
    conn.execute("CREATE TABLE uniq (code text UNIQUE NOT NULL, body text)")
    with pytest.raises(UsageError, match="has no primary key"):
        add(conn, table="uniq")
    spec = add(conn, table="uniq", key="code")
    assert spec.key_column == "code" and spec.key_type == "text"
    with pytest.raises(UsageError, match="not unique"):
        add(conn, "other", table="nokey", key="id")


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("name", "reviews; drop table x"),
        ("table", "reviews; drop table x"),
        ("column", "reviews; drop table x"),
        ("key", "reviews; drop table x"),
        ("name", "Robert'); DROP TABLE reviews;--"),
        ("column", 'body" text); --'),
    ],
)
def test_hostile_identifiers_are_refused(
    reviews: psycopg.Connection, field: str, value: str
) -> None:
    kwargs: dict[str, Any] = {"name": "minilm", "table": "reviews", "column": "body", field: value}
    with pytest.raises(UsageError, match="invalid"):
        models.add(reviews, models.AddRequest(**kwargs))
    assert reviews.execute("SELECT count(*) FROM reviews").fetchone() == (8,)
    assert reviews.execute("SELECT count(*) FROM pgembed.models").fetchone() == (0,)


def test_missing_table_column_and_unknown_model(reviews: psycopg.Connection) -> None:
    with pytest.raises(NotFoundError, match=r"table public\.nope does not exist"):
        add(reviews, table="nope")
    with pytest.raises(NotFoundError, match="column 'nope' does not exist"):
        add(reviews, column="nope")
    with pytest.raises(UsageError, match="not text"):
        add(reviews, column="stars")
    with pytest.raises(NotFoundError, match="unknown model 'ghost'"):
        models.remove(reviews, "ghost")
    reviews.execute("CREATE VIEW good_reviews AS SELECT * FROM reviews")
    reviews.execute("CREATE MATERIALIZED VIEW cached_reviews AS SELECT * FROM reviews")
    with pytest.raises(UsageError, match=r"public\.good_reviews is a view: a model watches a tab"):
        add(reviews, table="good_reviews")
    with pytest.raises(UsageError, match=r"public\.cached_reviews is a materialized view"):
        add(reviews, table="cached_reviews")


def test_unloadable_model_ref_changes_nothing(reviews: psycopg.Connection) -> None:
    with pytest.raises(ModelLoadError, match="does not exist"):
        add(reviews, model_ref="/no/such/model/dir")
    with pytest.raises(ModelLoadError, match="offline"):
        add(reviews, model_ref="some-org/some-model")
    assert "embedding_minilm" not in columns(reviews)
    assert reviews.execute("SELECT count(*) FROM pgembed.models").fetchone() == (0,)


def test_list_and_remove(reviews: psycopg.Connection, db_url: str) -> None:
    add(reviews, "minilm")
    add(reviews, "minilm_cls", pooling="cls")
    listed = cli("--database-url", db_url, "model", "list", "--json")
    assert listed.exit_code == 0
    assert [m["name"] for m in json.loads(listed.output)] == ["minilm", "minilm_cls"]
    removed = cli("--database-url", db_url, "model", "remove", "minilm")
    assert removed.exit_code == 0, removed.output
    cols = columns(reviews)
    assert "embedding_minilm" not in cols and "embedding_minilm_cls" in cols
    assert {"id", "body", "stars"} <= cols.keys()
    assert reviews.execute("SELECT count(*) FROM reviews").fetchone() == (8,)
    assert reviews.execute(
        "SELECT count(*) FROM pgembed.queue WHERE model = 'minilm'"
    ).fetchone() == (0,)
    assert reviews.execute(
        "SELECT count(*) FROM pg_trigger WHERE tgname LIKE 'pgembed_minilm\\_%%' "
        "AND tgname NOT LIKE 'pgembed_minilm_cls%%'"
    ).fetchone() == (0,)


def daemon_privileges(conn: psycopg.Connection) -> set[tuple[str, str]]:
    rows = conn.execute(
        "SELECT column_name, privilege_type FROM information_schema.column_privileges "
        "WHERE grantee = 'pgembed_daemon' AND table_name = 'reviews'"
    ).fetchall()
    return {(column, privilege) for column, privilege in rows}


def test_remove_takes_back_the_daemons_grants_by_the_columns_it_holds_now(
    reviews: psycopg.Connection, db_url: str
) -> None:
    """A model whose text column was renamed since is removed with the daemon role's privileges
    on it (they follow the column's new name); the table's other model keeps its own."""
    roles.create(reviews)
    reviews.execute("ALTER TABLE reviews ADD COLUMN title text")
    add(reviews, "on_body")
    add(reviews, "on_title", column="title")
    reviews.execute("ALTER TABLE reviews RENAME COLUMN title TO headline")
    assert ("headline", "SELECT") in daemon_privileges(reviews)
    removed = cli("--database-url", db_url, "model", "remove", "on_title")
    assert removed.exit_code == 0, removed.output
    kept = {("id", "SELECT"), ("body", "SELECT")}
    kept |= {("embedding_on_body", "SELECT"), ("embedding_on_body", "UPDATE")}
    assert daemon_privileges(reviews) == kept
    removed = cli("--database-url", db_url, "model", "remove", "on_body")
    assert removed.exit_code == 0, removed.output
    assert daemon_privileges(reviews) == set()


def test_remove_leaves_the_grants_of_a_broken_model_of_the_same_table(
    reviews: psycopg.Connection, db_url: str
) -> None:
    """While a model of the table is broken (its text column renamed), removing another takes
    back only the removed model's own columns: the renamed one may be the broken model's, whose
    sync needs it again once it is renamed back (a review found it stripped for good)."""
    roles.create(reviews)
    reviews.execute("ALTER TABLE reviews ADD COLUMN title text")
    add(reviews, "on_body")
    add(reviews, "on_title", column="title")
    reviews.execute("ALTER TABLE reviews RENAME COLUMN title TO headline")
    removed = cli("--database-url", db_url, "model", "remove", "on_body")
    assert removed.exit_code == 0, removed.output
    reviews.execute("ALTER TABLE reviews RENAME COLUMN headline TO title")
    kept = {("id", "SELECT"), ("title", "SELECT")}
    kept |= {("embedding_on_title", "SELECT"), ("embedding_on_title", "UPDATE")}
    assert daemon_privileges(reviews) == kept


def test_cli_add_reports_and_refuses_duplicates(reviews: psycopg.Connection, db_url: str) -> None:
    ok = cli(
        "--database-url", db_url, "model", "add", "minilm", "--table", "reviews", "--column", "body"
    )
    assert ok.exit_code == 0, ok.output
    assert "8 rows queued" in ok.output
    again = cli(
        "--database-url", db_url, "model", "add", "minilm", "--table", "reviews", "--column", "body"
    )
    assert again.exit_code == 2
    assert "already exists: see `pgembed model list`" in again.output
    # As an interrupted `model add --backfill` leaves it: set up, its index not yet built.
    reviews.execute("DROP INDEX " + naming.index_name(registry.get(reviews, "minilm")))
    resumed = cli(
        "--database-url", db_url, "model", "add", "minilm", "--table", "reviews", "--column", "body"
    )
    assert resumed.exit_code == 2
    assert "already exists, without its HNSW index" in resumed.output
    assert "`pgembed reindex minilm --index-only` builds the index" in resumed.output
