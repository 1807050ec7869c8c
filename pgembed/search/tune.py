"""`pgembed tune`: the smallest hnsw.ef_search whose results agree enough with exact search.

Recall here is the index's recall@k against exact search (not against human judgements), on
queries that are not rows of the table: the user's query texts, or else excerpts of rows' texts
(a sentence-long run of words from each of a sample of rows). A stored vector used as a query
sits on the graph the index searches and is found far more easily than a real query, so it
flattered small ef_search values (docs/evaluation.md has the measurements). The target must be
met with 95 % confidence (the sample is a sample), and unless asked tune never goes below the
default ef_search an untuned model searches with (pgvector's 40, or pgembed's default for the
table's size, see topk.effective_ef_search) nor records a recall below the default's.
The value found is recorded as the model's `ef_search`, which pgembed's searches then apply.
Then, unless asked for one walk, two walks (search/walks.py): a narrower first walk and a wider
second one past a cutoff distance, recorded too when they meet the same target and floor at a
mean effort below the one walk's; pgembed.search applies them to its unfiltered searches of 10
rows (others walk once, at `ef_search`).
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import psycopg
from psycopg import sql

from pgembed import sqlfiles
from pgembed.catalog import naming
from pgembed.catalog.registry import ModelSpec
from pgembed.encode import embedder
from pgembed.encode.settings import settings_of
from pgembed.errors import NotFoundError, UsageError
from pgembed.search import recall, topk, walks

# pgvector accepts 1..1000; the default is 40.
LADDER = (10, 20, 40, 60, 80, 100, 150, 200, 300, 400, 500, 600, 800, 1000)
# Words in an excerpt query, about a sentence: on SciFact, the length whose recall curve was
# closest to the real queries' (docs/evaluation.md).
EXCERPT_WORDS = (10, 25)
EXCERPTS = "excerpts of rows' texts"


@dataclass(frozen=True)
class Step:
    ef_search: int
    recall: float  # mean over the queries
    lower: float  # 95 % lower confidence bound of the mean: what must reach the target


@dataclass(frozen=True)
class Tuning:
    model: str
    k: int
    target: float
    sample: int  # queries used
    queries: str  # where they came from: a file, or EXCERPTS
    default_ef_search: int  # the server's, which an untuned model searches with
    default_recall: float | None  # at default_ef_search (None: not measured, ladder stopped below)
    ef_search: int  # recorded
    recall: float  # at the recorded ef_search
    reached: bool  # False: no ef_search tried met the target (the best recall is recorded)
    steps: tuple[Step, ...]
    two_walks: walks.TwoWalks | None = None  # recorded too, for unfiltered searches of 10 rows
    # Not recorded: two walks that meet the target but not the floor (--allow-below-default).
    two_walks_below_default: walks.TwoWalks | None = None


def tune(
    conn: psycopg.Connection,
    spec: ModelSpec,
    target: float = 0.95,
    k: int = 10,
    queries: Sequence[str] = (),
    sample: int = 200,
    allow_below_default: bool = False,
    source: str = "",
    two_walks: bool = True,
) -> Tuning:
    """Climb the ladder (from the default unless allowed lower) until recall@k reaches `target`;
    then, at k = 10, measure two walks (unless `two_walks` is False)."""
    if not 0 < target <= 1:
        raise UsageError("--target-recall must be in (0, 1]")
    if k < 1 or sample < 1:
        raise UsageError("-k and --sample must be at least 1")
    texts = list(queries[:sample]) if queries else excerpts(conn, spec, sample)
    if not texts:
        raise NotFoundError(f"model {spec.name!r} has no vectors yet: run `pgembed sync`")
    vectors = embedder.get(settings_of(spec)).encode_queries(texts)
    exact = topk.exact(conn, spec, vectors, k)
    default = topk.effective_ef_search(conn, spec, None)
    steps: list[Step] = []
    floor = 0.0  # no recall recorded may be below it: the default's, unless allowed below
    for ef in ladder(k, default, allow_below_default):
        steps.append(step(ef, topk.indexed(conn, spec, vectors, k, ef), exact))
        if len(steps) == 1 and not allow_below_default:
            floor = steps[0].recall
        if meets(steps[-1], target, floor):
            break
    best = choose(steps, target, floor)
    reached = meets(best, target, floor)
    pair = below = None
    if two_walks and reached and k == walks.K:
        pair, below = walks.measure(conn, spec, vectors, exact, best.ef_search, target, floor)
    record(conn, spec.name, best.ef_search, pair)
    return Tuning(
        model=spec.name,
        k=k,
        target=target,
        sample=len(texts),
        queries=source if queries else EXCERPTS,
        default_ef_search=default,
        default_recall=next((s.recall for s in steps if s.ef_search == default), None),
        ef_search=best.ef_search,
        recall=best.recall,
        reached=reached,
        steps=tuple(steps),
        two_walks=pair,
        two_walks_below_default=below,
    )


def ladder(k: int, default: int, allow_below_default: bool) -> list[int]:
    """The ef_search values to try, in order: none below k (it would return fewer rows), and
    none below the default unless allowed (the default is on it whenever it is at least k)."""
    low = k if allow_below_default else max(k, default)
    return sorted({ef for ef in (*LADDER, default) if low <= ef <= LADDER[-1]} or {LADDER[-1]})


def step(ef_search: int, found: list[list[str]], exact: list[list[str]]) -> Step:
    """Recall@k against exact search at one ef_search: its mean and 95 % lower bound."""
    measured = recall.of(recall.shares(found, exact))
    return Step(ef_search, measured.mean, measured.lower)


def meets(s: Step, target: float, floor: float) -> bool:
    return recall.Recall(s.recall, s.lower).meets(target, floor)


def choose(steps: Sequence[Step], target: float, floor: float) -> Step:
    """The first step meeting the target (and the floor, the default's recall); else the best
    recall, the smallest such ef_search. Without --allow-below-default the default's step is
    the first tried, so a step chosen either way has a recall at least the default's."""
    met = [s for s in steps if meets(s, target, floor)]
    return met[0] if met else max(steps, key=lambda s: (s.recall, -s.ef_search))


def excerpts(conn: psycopg.Connection, spec: ModelSpec, n: int) -> list[str]:
    """Up to n query-like texts: a run of 10-25 words from each of n rows (a fixed choice).

    Not rows' vectors: a query that is a point of the index is found almost at once, while a real
    query is a short text near, not on, the documents it should find; an excerpt is that."""
    rows = conn.execute(
        sql.SQL(
            "SELECT ({text})::pg_catalog.text FROM {table} t "
            "WHERE t.{col} IS NOT NULL AND {text} IS NOT NULL "
            "ORDER BY pg_catalog.md5(t.{key}::text) LIMIT %s"
        ).format(
            text=naming.text_expression(spec, "t"),
            col=sql.Identifier(spec.embedding_column),
            key=sql.Identifier(spec.key_column),
            table=naming.only(spec),
        ),
        (n,),
    ).fetchall()
    rng = random.Random(0)  # the same texts every run, so runs compare
    return [e for (text,) in rows if (e := excerpt(text, rng))]


def excerpt(text: str, rng: random.Random) -> str:
    """A run of EXCERPT_WORDS words at a random place; of a shorter text, about half of it.
    A text with few spaces for its length (Chinese, Japanese, Thai) is cut in characters."""
    words, sep = text.split(), " "
    if len(words) * 16 < len(text):  # English runs 5-10 characters a word
        words, sep = list("".join(words)), ""
    lo, hi = EXCERPT_WORDS
    length = min(rng.randint(lo, hi), max(1, (len(words) + 1) // 2))
    start = rng.randint(0, max(0, len(words) - length))
    return sep.join(words[start : start + length])


def read_queries(path: Path) -> list[str]:
    """Query texts from a file: one a line, or BEIR JSON lines (`{"_id": ..., "text": ...}`)
    when the first non-blank line starts with `{`. Blank lines are skipped."""
    try:
        lines = [line.strip() for line in path.read_text(encoding="utf-8").splitlines()]
    except OSError as exc:
        raise UsageError(f"cannot read --queries {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise UsageError(f"--queries {path} is not UTF-8 text") from None
    numbered = [(n, line) for n, line in enumerate(lines, 1) if line]
    if not numbered:
        raise UsageError(f"--queries {path} has no query: expected one query text a line")
    if not numbered[0][1].startswith("{"):
        return [line for _, line in numbered]
    return [_json_text(path, n, line) for n, line in numbered]


def _json_text(path: Path, number: int, line: str) -> str:
    try:
        text = json.loads(line)["text"]
    except (ValueError, KeyError, TypeError):
        text = None
    if not isinstance(text, str) or not text.strip():
        raise UsageError(f"{path}:{number}: expected a JSON object with a non-empty `text`")
    return text


def record(
    conn: psycopg.Connection, name: str, ef_search: int | None, pair: walks.TwoWalks | None
) -> None:
    """The model's ef_search, and its two walks (None: one walk; older ones are forgotten)."""
    conn.execute(
        sqlfiles.get("catalog", "set_tuning"),
        {
            "name": name,
            "ef_search": ef_search,
            "first": pair.first if pair else None,
            "second": pair.second if pair else None,
            "distance": pair.distance if pair else None,
        },
    )
