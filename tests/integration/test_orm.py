"""pgembed.contrib.sqlalchemy with SQLAlchemy 2.0 (and Alembic), on the real database and model."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from pgvector.sqlalchemy import Vector
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from pgembed import db
from pgembed.contrib import sqlalchemy as orm
from pgembed.errors import NotFoundError, UsageError
from pgembed.lifecycle import models
from pgembed.search import vectors


class Base(DeclarativeBase):
    pass


class Review(Base):
    __tablename__ = "reviews"
    id: Mapped[int] = mapped_column(primary_key=True)
    product: Mapped[str]
    category: Mapped[str]
    rating: Mapped[int]
    text: Mapped[str]
    embedding_minilm: Mapped[Any] = mapped_column(Vector(384), deferred=True, nullable=True)


class Item(Base):
    __tablename__ = "items"
    id: Mapped[int] = mapped_column(primary_key=True)
    body: Mapped[str]
    bucket: Mapped[str]
    embedding_minilm: Mapped[Any] = mapped_column(Vector(384), deferred=True, nullable=True)


class Other(DeclarativeBase):
    pass


class Unmapped(Other):
    """The reviews table without its vector column."""

    __tablename__ = "reviews"
    id: Mapped[int] = mapped_column(primary_key=True)


class Elsewhere(Other):
    __tablename__ = "not_reviews"
    id: Mapped[int] = mapped_column(primary_key=True)


class KeyAsText(sa.types.TypeDecorator[str]):
    """An integer key that the mapping reads back as a str (as sa.Uuid(as_uuid=False) does)."""

    impl = sa.Integer
    cache_ok = True

    def process_bind_param(self, value: str | None, dialect: sa.Dialect) -> int | None:
        return None if value is None else int(value)

    def process_result_value(self, value: int | None, dialect: sa.Dialect) -> str | None:
        return None if value is None else str(value)


class Third(DeclarativeBase):
    pass


class ReviewByText(Third):
    __tablename__ = "reviews"
    id: Mapped[str] = mapped_column(KeyAsText, primary_key=True)
    embedding_minilm: Mapped[Any] = mapped_column(Vector(384), deferred=True, nullable=True)


def engine_for(url: str) -> sa.Engine:
    return sa.create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))


@pytest.fixture
def session(shop_url: str) -> Iterator[Session]:
    engine = engine_for(shop_url)
    with Session(engine) as s:
        yield s
    engine.dispose()


@pytest.fixture
def items_session(items_url: str) -> Iterator[Session]:
    engine = engine_for(items_url)
    with Session(engine) as s:
        yield s
    engine.dispose()


def exact(session: Session, statement: str, **params: Any) -> list[tuple[int, float]]:
    """Rows of a hand-written exact search (vector parameter :q)."""
    query = sa.text(statement)
    if "q" in params:
        query = query.bindparams(sa.bindparam("q", type_=Vector(384)))
    return [(int(k), float(s)) for k, s in session.execute(query, params)]


def test_nearest_with_where(session: Session) -> None:
    session.execute(sa.text("SET enable_indexscan = off"))  # exact, to compare row for row
    hits = orm.nearest(
        session, Review, "minilm", "battery dies fast", k=5, where=Review.rating >= 4
    )
    assert len(hits) == 5
    assert all(isinstance(r, Review) and r.rating >= 4 for r, _ in hits)
    q = vectors.embed_query(orm.model_spec(session, "minilm"), "battery dies fast")
    same = exact(
        session,
        "SELECT id, 1 - (embedding_minilm <=> :q) FROM reviews WHERE rating >= 4 "
        "ORDER BY embedding_minilm <=> :q LIMIT 5",
        q=q,
    )
    assert [r.id for r, _ in hits] == [key for key, _ in same]
    assert [s for _, s in hits] == pytest.approx([s for _, s in same], abs=1e-6)
    assert "embedding_minilm" not in hits[0][0].__dict__  # deferred: the vector stays in the db


def test_similar_to_and_neighbours(session: Session) -> None:
    session.execute(sa.text("SET enable_indexscan = off"))  # exact, to compare row for row
    hits = orm.similar_to(session, Review, "minilm", 1, k=4)
    same = exact(
        session,
        "SELECT r.id, 1 - (r.embedding_minilm <=> o.embedding_minilm) FROM reviews r, reviews o "
        "WHERE o.id = 1 AND r.id <> 1 ORDER BY r.embedding_minilm <=> o.embedding_minilm LIMIT 4",
    )
    assert [r.id for r, _ in hits] == [key for key, _ in same]
    assert [s for _, s in hits] == pytest.approx([s for _, s in same], abs=1e-6)
    laptops = orm.neighbours(session, Review, "minilm", 1, k=3, where=Review.category == "laptops")
    assert len(laptops) == 3 and {r.category for r, _ in laptops} == {"laptops"}


def statements(session: Session) -> list[tuple[str, Any]]:
    seen: list[tuple[str, Any]] = []
    sa.event.listen(
        session.get_bind(),
        "before_cursor_execute",
        lambda _c, _cur, statement, params, _ctx, _many: seen.append((statement, params)),
    )
    return seen


def index_scans(session: Session) -> int:
    """Scans of the model's HNSW index so far in the session's transaction."""
    count = sa.text("SELECT pg_stat_get_xact_numscans('pgembed_minilm_hnsw'::regclass)")
    return int(session.execute(count).scalar_one())


def test_nearest_goes_through_the_helper_and_its_index(items_session: Session) -> None:
    # The search is pgembed.search's, run on the session's connection (below SQLAlchemy's
    # events); SQLAlchemy sees one statement, loading the hits' instances, no search of its own.
    seen = statements(items_session)
    before = index_scans(items_session)
    hits = orm.nearest(items_session, Item, "minilm", "anything", k=10)
    assert len(hits) == 10 and index_scans(items_session) > before
    assert [h for _, h in hits] == sorted((h for _, h in hits), reverse=True)
    loads = [s for s, _ in seen if "FROM ONLY items" in s]  # not an inheritance child's rows
    assert len(loads) == 1 and "<=>" not in loads[0]
    seen.clear()
    before = index_scans(items_session)
    like = orm.similar_to(items_session, Item, "minilm", 5, k=10)
    assert len(like) == 10 and 5 not in {i.id for i, _ in like}
    assert index_scans(items_session) > before
    assert not [s for s, _ in seen if "<=>" in s]


def test_where_matching_2_percent_still_returns_k(items_session: Session) -> None:
    before = index_scans(items_session)
    rare = orm.nearest(items_session, Item, "minilm", "x", k=10, where=Item.bucket == "rare")
    assert len(rare) == 10 and {i.bucket for i, _ in rare} == {"rare"}
    assert index_scans(items_session) > before  # through the index, read deeper as needed
    assert [h for _, h in rare] == sorted((h for _, h in rare), reverse=True)
    items_session.commit()
    # The settings lasted only for that transaction; a caller's own setting wins.
    show = sa.text("SHOW hnsw.iterative_scan")
    assert items_session.execute(show).scalar() == "off"
    items_session.execute(sa.text("SET LOCAL hnsw.iterative_scan = strict_order"))
    again = orm.nearest(items_session, Item, "minilm", "x", k=10, where=Item.bucket == "rare")
    assert len(again) == 10 and items_session.execute(show).scalar() == "strict_order"
    items_session.commit()
    # Without pgembed's settings, the plain statement runs the index dry early.
    items_session.execute(sa.text("SET LOCAL enable_seqscan = off"))  # keep the planner on HNSW
    plain = sa.select(Item.id).where(Item.bucket == "rare")
    vector = items_session.execute(sa.select(Item.embedding_minilm).where(Item.id == 0)).scalar()
    few = items_session.execute(
        plain.order_by(Item.embedding_minilm.cosine_distance(vector)).limit(10)
    )
    assert len(few.all()) < 10


def test_filter_and_ef_search_are_the_helpers(items_session: Session) -> None:
    rare = orm.nearest(items_session, Item, "minilm", "x", k=10, where=Item.bucket == "rare")
    same = orm.nearest(
        items_session, Item, "minilm", "x", k=10, filter={"bucket": "rare"}, ef_search=400
    )
    assert len(same) == 10 and {i.bucket for i, _ in same} == {"rare"}
    assert len({i.id for i, _ in same} & {i.id for i, _ in rare}) >= 8  # both nearly exact
    # ef_search held for that search alone: the session's transaction does not keep it.
    setting = sa.text("SELECT current_setting('pgembed.ef_search', true)")
    assert items_session.execute(setting).scalar() in (None, "")


def test_keys_read_back_in_another_form_and_pending_changes(session: Session) -> None:
    """Hits are matched to rows by the server, whatever Python form the mapping gives keys; a
    search sees the session's unflushed changes, as a select does."""
    hits = orm.nearest(session, Review, "minilm", "battery dies fast", k=3)
    as_text = orm.nearest(session, ReviewByText, "minilm", "battery dies fast", k=3)
    assert [(r.id, s) for r, s in as_text] == [(str(r.id), s) for r, s in hits]
    session.delete(hits[0][0])  # not flushed yet
    after = orm.nearest(session, Review, "minilm", "battery dies fast", k=3)
    assert len(after) == 3 and hits[0][0].id not in {r.id for r, _ in after}
    assert [r.id for r, _ in after[:2]] == [r.id for r, _ in hits[1:]]
    session.rollback()


def test_orm_errors(session: Session) -> None:
    with pytest.raises(NotFoundError, match="unknown model 'nope'"):
        orm.nearest(session, Review, "nope", "x")
    with pytest.raises(UsageError, match=r"mapped_column\(Vector\(384\), deferred=True\)"):
        orm.nearest(session, Unmapped, "minilm", "x")
    with pytest.raises(UsageError, match=r"watches public\.reviews"):
        orm.nearest(session, Elsewhere, "minilm", "x")
    with pytest.raises(NotFoundError, match="no row with id = 99999"):
        orm.similar_to(session, Review, "minilm", 99999)
    with pytest.raises(UsageError, match="k must be an integer from 1"):
        orm.nearest(session, Review, "minilm", "x", k=0)


def app_metadata(with_vector: bool) -> sa.MetaData:
    """The reviews table as an application that knows nothing of pgembed would declare it."""
    metadata = sa.MetaData()
    columns: list[sa.Column[Any]] = [
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("product", sa.Text, nullable=False),
        sa.Column("category", sa.Text, nullable=False),
        sa.Column("rating", sa.Integer, nullable=False),
        sa.Column("text", sa.Text, nullable=False),
    ]
    if with_vector:
        columns.append(sa.Column("embedding_minilm", Vector(384)))
    sa.Table("reviews", metadata, *columns, sa.CheckConstraint("rating BETWEEN 1 AND 5"))
    return metadata


def autogenerate(url: str, metadata: sa.MetaData, **options: Any) -> list[Any]:
    engine = engine_for(url)
    with engine.connect() as conn:
        context = MigrationContext.configure(conn, opts={"compare_type": True, **options})
        diffs = compare_metadata(context, metadata)
    engine.dispose()
    return list(diffs)


def test_alembic_autogenerate_leaves_pgembed_alone(shop_url: str) -> None:
    with db.connection(shop_url) as conn:  # a chunked model has a table beside `reviews`
        request = models.AddRequest(
            "chunked", "reviews", "text", precision="fp32", long_texts="chunk"
        )
        models.add(conn, request)
    # Without the helper, autogenerate would drop pgembed's column, indexes and chunk table.
    naive = str(autogenerate(shop_url, app_metadata(with_vector=False)))
    assert "remove_column" in naive and "embedding_minilm" in naive
    assert "pgembed_minilm_hnsw" in naive and "pgembed_minilm_fts" in naive
    assert "remove_table" in naive and "pgembed_chunked_chunks" in naive
    helped = {"include_object": orm.include_object}
    assert autogenerate(shop_url, app_metadata(with_vector=False), **helped) == []
    assert autogenerate(shop_url, app_metadata(with_vector=True), **helped) == []
    # With every schema compared, pgembed's own tables are left alone too.
    everything = {"include_schemas": True, **helped}
    assert autogenerate(shop_url, app_metadata(with_vector=False), **everything) == []
    assert (
        autogenerate(
            shop_url,
            app_metadata(with_vector=False),
            include_schemas=True,
            include_name=orm.include_name,
        )
        == []
    )
