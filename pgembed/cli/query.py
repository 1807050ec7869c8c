"""`pgembed query`: the rows nearest to a text or to a row."""

from __future__ import annotations

import json

import click

from pgembed.cli.app import App, pass_app
from pgembed.cli.terminal import printable
from pgembed.encode import embedder
from pgembed.errors import UsageError
from pgembed.search import planner

# The request's rules in this command's terms (planner.RequestError.rule -> message).
_MESSAGES = {
    "source": "give either TEXT or --similar-to KEY",
    "hybrid": "--hybrid needs TEXT (it ranks the text's words too)",
}


@click.command("query")
@click.argument("text", required=False)
@click.option("--model", "model_name", required=True, help="The model to search with.")
@click.option("-k", "k", type=click.IntRange(1, planner.MAX_K), default=10, show_default=True)
@click.option(
    "--filter",
    "filter_json",
    metavar="JSON",
    help='Only rows matching {"col": value, ...}; a value may be {"$OP": value} with $OP one '
    "of $eq, $ne, $gt, $gte, $lt, $lte or $in (a list); conditions are ANDed. See docs/search.md "
    '"Filters".',
)
@click.option("--similar-to", metavar="KEY", help="Rows like this row (instead of TEXT).")
@click.option("--hybrid", is_flag=True, help="Fuse with a full-text ranking of TEXT.")
@click.option("--ef-search", type=click.IntRange(1, 1000), help="hnsw.ef_search for this query.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_app
def query_cmd(
    app: App,
    text: str | None,
    model_name: str,
    k: int,
    filter_json: str | None,
    similar_to: str | None,
    hybrid: bool,
    ef_search: int | None,
    as_json: bool,
) -> None:
    """Print the K rows nearest to TEXT (or to the row --similar-to KEY)."""
    try:
        request = planner.SearchRequest(
            model_name,
            text=text,
            similar_to=similar_to,
            k=k,
            filter=planner.parse_filter(filter_json),
            hybrid=hybrid,
            ef_search=ef_search,
        )
    except planner.RequestError as exc:
        raise UsageError(_MESSAGES.get(exc.rule, str(exc))) from None
    # A one-off process: the query is encoded without importing torch where the model allows
    # (encode/light.py), which takes a cold start from seconds to under one.
    with app.connect() as conn, embedder.light_encoder():
        hits = planner.run(conn, request)
        # Nothing found under a filter: say why when a value is one no row has (an error, like
        # any bad input), else say so on stderr, rather than print nothing.
        note = planner.filter_note(conn, request) if not hits else None
        # A filter on a column no index leads with scans a big table whole when it is selective.
        index_note = planner.filter_index_note(conn, request)
    if index_note:
        click.echo(f"pgembed: note: {printable(index_note)}", err=True)
    if note:
        raise UsageError(f"no rows: {note}")
    if not hits and request.filter:
        click.echo("no rows match the filter", err=True)
    if as_json:
        # Keys keep their JSON type (an integer key is a number); others (uuid, date) are strings.
        click.echo(json.dumps([planner.hit_fields(h) for h in hits], default=str))
        return
    for h in hits:
        score = f"{h.similarity:.3f}" if isinstance(h, planner.Hit) else f"{h.score:.4f}"
        click.echo(f"{printable(planner.shown_key(h.key))}\t{score}\t{snippet(h.text)}")


def snippet(text: str, width: int = 100) -> str:
    """The text on one line, cut at `width`, its control characters shown as escapes."""
    flat = printable(" ".join(text.split()))
    return flat if len(flat) <= width else flat[: width - 1] + "…"
