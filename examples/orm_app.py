"""A small application that maps its table with SQLAlchemy and searches it with
pgembed.contrib.sqlalchemy, using only pgembed's public API.

    python examples/orm_app.py postgresql://user@host:5432/dbname

It creates its `app_reviews` table (as its own migrations would), registers the pgembed model
`app_minilm` on the review text, embeds the rows, then asks two questions through the ORM.
Safe to run again, and beside other pgembed models (the demo's, the README tour's `minilm`): the
model has a name of its own, and `exist_ok=True` accepts it only on this table's column.
"""

from __future__ import annotations

import sys
from typing import Any

import sqlalchemy as sa
from pgvector.sqlalchemy import Vector
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

import pgembed
from pgembed.contrib import sqlalchemy as orm

MODEL = "app_minilm"  # its vector column is embedding_app_minilm


class Base(DeclarativeBase):
    pass


class Review(Base):
    __tablename__ = "app_reviews"

    id: Mapped[int] = mapped_column(primary_key=True)
    product: Mapped[str]
    rating: Mapped[int]
    body: Mapped[str]
    # Added and kept fresh by pgembed; mapped with pgvector's type, deferred so that loading a
    # Review never drags its 384 floats along.
    embedding_app_minilm: Mapped[Any] = mapped_column(Vector(384), deferred=True, nullable=True)


REVIEWS = [
    (1, "Nimbus X3 phone", 2, "The battery is dead by lunchtime, even with the screen dimmed."),
    (2, "Tideline Mini phone", 5, "Battery life is outstanding: two days between charges."),
    (3, "Quill 12 laptop", 5, "I charged it on Sunday and it lasted until Wednesday."),
    (4, "Juno power bank", 4, "Tops my phone up twice, small enough for a jacket pocket."),
    (5, "Orchard apples", 5, "Crisp, sweet and juicy; the kids finished the bag in a day."),
    (6, "Hushwave headphones", 4, "The noise cancelling makes the train silent."),
    (7, "Tessel wall adapter", 1, "Gets hot and stopped charging after a week."),
    (8, "Meridian laptop", 2, "After four months the battery will not hold more than 40%."),
]

# The application's own schema; in a real project this is an Alembic migration (with
# pgembed.contrib.sqlalchemy.include_object in env.py: autogenerate leaves pgembed alone).
CREATE_TABLE = """
CREATE TABLE IF NOT EXISTS app_reviews (
    id integer PRIMARY KEY,
    product text NOT NULL,
    rating integer NOT NULL,
    body text NOT NULL
)
"""


def sqlalchemy_url(url: str) -> str:
    """postgresql://... -> postgresql+psycopg://... (SQLAlchemy's psycopg 3 driver)."""
    scheme, _, rest = url.partition("://")
    return f"postgresql+psycopg://{rest}" if scheme in ("postgres", "postgresql") else url


def setup(url: str, engine: sa.Engine) -> None:
    pgembed.migrate_schema(url)
    with engine.begin() as conn:
        conn.execute(sa.text(CREATE_TABLE))
    pgembed.add_model(MODEL, "app_reviews", "body", exist_ok=True, database_url=url)
    with Session(engine) as session, session.begin():
        for key, product, rating, body in REVIEWS:
            session.merge(Review(id=key, product=product, rating=rating, body=body))
    result = pgembed.sync_once([MODEL], database_url=url)
    print(f"synced: {result.written} reviews embedded")


def main(url: str) -> None:
    engine = sa.create_engine(sqlalchemy_url(url))
    setup(url, engine)
    with Session(engine) as session:
        print('nearest to "battery dies fast" among reviews rated 4 or more:')
        hits = orm.nearest(
            session, Review, MODEL, "battery dies fast", k=3, where=Review.rating >= 4
        )
        for review, similarity in hits:
            print(f"  {similarity:.3f} id={review.id} rating={review.rating} {review.body}")
        print("reviews like review 1:")
        for review, similarity in orm.similar_to(session, Review, MODEL, 1, k=3):
            print(f"  {similarity:.3f} id={review.id} rating={review.rating} {review.body}")
    engine.dispose()


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(f"usage: {sys.argv[0]} DATABASE_URL")
    try:
        main(sys.argv[1])
    except pgembed.PgembedError as exc:  # one line, e.g. a model of this name on another table
        sys.exit(f"orm_app: {exc}")
