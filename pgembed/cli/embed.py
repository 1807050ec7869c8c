"""`pgembed embed`: a query text's vector, printed for psql and other tools."""

from __future__ import annotations

import json
import sys

import click
import numpy as np

from pgembed.cli.app import App, pass_app
from pgembed.encode import embedder
from pgembed.encode.embedder import Vectors
from pgembed.errors import UsageError
from pgembed.search import plan, planner

# planner.RequestError.rule -> this command's wording.
_MESSAGES = {"empty": "the text to embed is empty"}


@click.command("embed")
@click.argument("text")
@click.option("--model", "model_name", required=True, help="The model whose query vector to print.")
@click.option(
    "--format",
    "output",
    type=click.Choice(["vector", "json"]),
    default="vector",
    show_default=True,
    help="vector: pgvector's text form [0.1,...] (psql: docs/search.md); "
    'json: {"model", "dimensions", "vector"}.',
)
@pass_app
def embed_cmd(app: App, text: str, model_name: str, output: str) -> None:
    """Print TEXT's query vector for the --model, made exactly as `pgembed query` makes it (the
    model's query prefix, pooling and normalisation). TEXT `-` reads it from stdin.

    \b
    In psql:  \\set v `pgembed embed 'battery dies fast' --model minilm`
              SELECT * FROM pgembed.search('minilm', :'v', 5);
    """
    if text == "-":
        # As bytes: a text stream takes bytes that are not UTF-8 for lone surrogates (in the C
        # locale), which were then refused as "a lone surrogate".
        raw = sys.stdin.buffer.read()
        try:
            # and its line ends as a text stream reads them (universal newlines)
            text = raw.decode("utf-8").replace("\r\n", "\n").replace("\r", "\n").rstrip("\n")
        except UnicodeDecodeError as exc:
            raise UsageError(
                f"standard input is not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset "
                f"{exc.start})"
            ) from None
    try:
        planner.require_text(text)
    except planner.RequestError as exc:
        raise UsageError(_MESSAGES.get(exc.rule, str(exc))) from None
    # A one-off process: the light encoder where the model allows it (see `pgembed query`).
    with app.connect() as conn, embedder.light_encoder():
        vector = plan.execute(conn, planner.embed_plan(model_name, text))
    literal = _literal(vector)
    if output == "json":  # the literal is a JSON array too, of exactly these digits
        head = f'{{"model": {json.dumps(model_name)}, "dimensions": {len(vector)}, "vector": '
        literal = f"{head}{literal}}}"
    click.echo(literal)


def _literal(vector: Vectors) -> str:
    """pgvector's text form; each float32 in its shortest form that reads back to itself."""
    return (
        "[" + ",".join(np.format_float_positional(x, unique=True, trim="-") for x in vector) + "]"
    )
