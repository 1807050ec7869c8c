"""`pgembed eval` and `pgembed tune`: how good a model's search is, and its ef_search."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import click

from pgembed.catalog import registry
from pgembed.cli.app import App
from pgembed.search import evaluate, tune, walks


@click.command("eval")
@click.argument("name")
@click.option(
    "--queries",
    "queries_path",
    type=click.Path(dir_okay=False, path_type=Path),
    required=True,
    help="BEIR queries: JSON lines with `_id` and `text`.",
)
@click.option(
    "--qrels",
    "qrels_path",
    type=click.Path(dir_okay=False, path_type=Path),
    required=True,
    help="BEIR qrels: TSV `query-id, corpus-id, score` with a header.",
)
@click.option("-k", "k", type=click.IntRange(1, 1000), default=10, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
def eval_cmd(
    app: App, name: str, queries_path: Path, qrels_path: Path, k: int, as_json: bool
) -> None:
    """nDCG@k, recall@k and MRR@k of model NAME, exact and through its index."""
    queries = evaluate.read_queries(queries_path)
    qrels = evaluate.read_qrels(qrels_path)
    with app.connect() as conn:
        result = evaluate.evaluate(conn, registry.get(conn, name), queries, qrels, k)
    if as_json:
        click.echo(json.dumps(asdict(result), indent=2))
        return
    click.echo(f"{name}: {result.queries} queries with qrels, k={k}")
    if result.skipped_queries or result.missing_documents:
        click.echo(
            f"  ({result.skipped_queries} qrels queries without text skipped; "
            f"{result.missing_documents} judged documents are not rows of the table)"
        )
    click.echo(f"  {'':<28}{'nDCG@' + str(k):>10}{'recall@' + str(k):>11}{'MRR@' + str(k):>9}")
    index = f"indexed (ef_search {result.ef_search})" + ("" if result.index_used else " [no index]")
    for label, m in (("exact", result.exact), (index, result.indexed)):
        click.echo(f"  {label:<28}{m.ndcg:>10.4f}{m.recall:>11.4f}{m.mrr:>9.4f}")
    click.echo(f"  index recall@{k} against exact search: {result.index_recall:.4f}")


@click.command("tune")
@click.argument("name")
@click.option(
    "--target-recall", type=click.FloatRange(0, 1, min_open=True), default=0.95, show_default=True
)
@click.option(
    "--queries",
    "queries_path",
    type=click.Path(path_type=Path),
    help="Query texts, one a line (or BEIR JSON lines). Default: excerpts of rows' texts.",
)
@click.option("-k", "k", type=click.IntRange(1, 1000), default=10, show_default=True)
@click.option(
    "--allow-below-default",
    is_flag=True,
    help="Also try ef_search below the default (40, more on big tables): can lower recall.",
)
@click.option(
    "--sample",
    type=click.IntRange(min=1),
    default=200,
    show_default=True,
    help="At most this many queries.",
)
@click.option(
    "--one-walk",
    is_flag=True,
    help="Record one ef_search only, not two walks (a narrow one, a wide one past a distance).",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
def tune_cmd(
    app: App,
    name: str,
    target_recall: float,
    queries_path: Path | None,
    k: int,
    allow_below_default: bool,
    sample: int,
    one_walk: bool,
    as_json: bool,
) -> None:
    """Find the smallest ef_search meeting the target recall@k and make it NAME's default.

    Never below the default ef_search (an untuned model's) unless --allow-below-default. With
    -k 10, also two walks for unfiltered searches of 10 rows, when they meet the target as
    well: a walk of at most half as much, and a wider one when its rows are far."""
    texts = tune.read_queries(queries_path) if queries_path else []
    with app.connect() as conn:
        spec = registry.get(conn, name)
        result = tune.tune(
            conn,
            spec,
            target_recall,
            k,
            texts,
            sample,
            allow_below_default=allow_below_default,
            source=str(queries_path),
            two_walks=not one_walk,
        )
    if as_json:
        click.echo(json.dumps(asdict(result), indent=2))
        return
    for step in result.steps:
        click.echo(
            f"  ef_search {step.ef_search:>4}: recall@{k} {step.recall:.4f} "
            f"(95 % lower bound {step.lower:.4f})"
        )
    verdict = "meets" if result.reached else "is the best tried but misses"
    click.echo(
        f"model {name}: ef_search {result.ef_search} recorded (recall@{k} {result.recall:.4f} on "
        f"{result.sample} queries, {result.queries}, {verdict} the target {result.target})"
    )
    pair = result.two_walks
    if pair is not None:
        click.echo(f"  and two walks for unfiltered searches of 10 rows: {_walks(pair, k)}")
    below = result.two_walks_below_default
    if below is not None:
        click.echo(
            f"  two walks would meet the target but not the untuned recall "
            f"({result.default_recall or 0:.4f}), not recorded: {_walks(below, k)}; "
            "--allow-below-default records them"
        )


def _walks(pair: walks.TwoWalks, k: int) -> str:
    return (
        f"ef_search {pair.first}, then {pair.second} when the first walk's rows are at a mean "
        f"cosine distance of {pair.distance:.4f} or more ({pair.twice:.0%} of the queries): "
        f"recall@{k} {pair.recall:.4f} (95 % lower bound {pair.lower:.4f}), {pair.effort:.0f} "
        "ef_search a query on average"
    )
