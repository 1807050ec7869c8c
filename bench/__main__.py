"""`make bench`: every benchmark in one run, figures as medians and ratios, into BENCHMARKS.md.

python -m bench [--rows 2000] [--repeats 3] [--corpus FILE] [--database-url URL]
                [--only throughput,capture,latency,search,serve,bigrow,indexpath,engines,chunking,
                        concurrency]
                [--no-write] [--scifact ../shared/data/scifact]  (SciFact nDCG@10 of each engine)
                [--chunk-rows 2000]  (IMDb reviews of the chunking section)
                [--scale-sizes 10000,100000,1000000] [--scale-home DIR]  (the scale section)
python -m bench --only searchscale [--scale-rows 10000,100000,1000000] [--scale-build-only]
                [--scale-sweep 160,320,400,480,640,1000]
                [--database-url URL of a server that outlives the run: its tables are kept]
"""

from __future__ import annotations

import argparse
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path

import torch

from bench import (
    bigrow,
    capture,
    chunking,
    concurrency,
    engines,
    indexpath,
    latency,
    report,
    scale,
    search,
    searchscale,
    serve,
    throughput,
)
from bench.env import Database, file_corpus, generated_corpus, server

SECTIONS = (
    "throughput",
    "capture",
    "latency",
    "search",
    "serve",
    "bigrow",
    "indexpath",
    "engines",
    "chunking",
    "concurrency",
)
# Asked for by name only (not in SECTIONS): minutes to an hour, datasets of gigabytes. `scale`
# runs on a server of its own (_scale); `searchscale` builds its tables in a kept database.
ON_REQUEST = {"scale"}
OWN_SECTIONS = {
    "serve",
    "bigrow",
    "indexpath",
    "engines",
    "chunking",
    "concurrency",
    "scale",
    "searchscale",
}  # not in the main one


def machine() -> str:
    try:
        cpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        model = next(
            (
                line.split(":", 1)[1].strip()
                for line in cpu.splitlines()
                if line.startswith("Model name")
            ),
            platform.processor(),
        )
    except OSError:
        model = platform.processor()
    return (
        f"{model}, {torch.get_num_threads()} torch threads, CPU capability "
        f"{torch.backends.cpu.get_cpu_capability()}, no GPU; Python {platform.python_version()}, "
        f"torch {torch.__version__}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2000, help="texts to embed (a-d, g, h)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--bulk-rows", type=int, default=100_000, help="rows per bulk load (e)")
    parser.add_argument("--latency-samples", type=int, default=40)
    parser.add_argument("--serve-rows", type=int, default=100_000, help="rows searched (j)")
    parser.add_argument("--serve-requests", type=int, default=200, help="requests timed (j)")
    parser.add_argument("--corpus", type=Path, help="CSV with a `text` column (gzip allowed)")
    parser.add_argument("--database-url", help="default: a temporary embedded server")
    parser.add_argument("--only", default=",".join(SECTIONS))
    parser.add_argument("--no-write", action="store_true", help="don't update BENCHMARKS.md")
    parser.add_argument("--scifact", type=Path, help="BEIR SciFact directory: engines' nDCG@10")
    parser.add_argument("--chunk-rows", type=int, default=chunking.IMDB_ROWS, help="IMDb rows (n)")
    parser.add_argument(
        "--scale-sizes", default=",".join(map(str, scale.SIZES)), help="rows per scale run"
    )
    parser.add_argument(
        "--scale-home",
        type=Path,
        default=Path.home() / ".cache/pgembed-bench-scale",
        help="the scale section's embedded server and built datasets, kept between runs",
    )
    parser.add_argument(
        "--scale-no-sync",
        action="store_true",
        help="skip the sync workers' run (reuse the real vectors of an earlier one)",
    )
    parser.add_argument(
        "--scale-rows", default=",".join(map(str, searchscale.SIZES)), help="rows (searchscale)"
    )
    parser.add_argument("--scale-build-only", action="store_true", help="build the tables, stop")
    parser.add_argument(
        "--scale-sweep",
        default="",
        help="ef_search values to sweep on the largest table, e.g. 160,320,400,480 (searchscale)",
    )
    parser.add_argument(
        "--scale-cache", type=Path, default=Path(".bench-cache"), help="embedded reviews (o)"
    )
    args = parser.parse_args(argv)
    only = set(args.only.split(","))
    if only <= ON_REQUEST:
        return _scale(args, argv)
    texts = file_corpus(args.corpus, args.rows) if args.corpus else generated_corpus(args.rows)
    queries = generated_corpus(100, seed=99)
    results: dict[str, object] = {}
    index_path: tuple[list[indexpath.Table], str] | None = None  # l: a section of its own
    chunked: list[chunking.Corpus] | None = None  # n: a section of its own
    many: concurrency.Run | None = None  # serving many clients: a section of its own
    scaled: dict[str, object] | None = None  # o: a section of its own, in a kept database
    started = time.monotonic()
    with server(args.database_url) as url:
        if "searchscale" in only:
            scaled = searchscale.run(
                url,
                args.corpus or indexpath.REVIEWS,
                args.scale_cache,
                tuple(int(n) for n in args.scale_rows.split(",")),
                args.scale_build_only,
                tuple(int(n) for n in args.scale_sweep.split(",") if n),
            )
            print(searchscale.report(scaled), flush=True)
        database = Database(url)
        try:
            with database.connect() as conn:
                results["postgres"] = conn.execute("SHOW server_version").fetchone()[0]  # type: ignore[index]
            if only & {"throughput", "latency", "search"}:
                tp = throughput.measure(database, texts, args.repeats)
                results["throughput"] = tp
                print(report.throughput(tp), flush=True)
            if "search" in only:
                from pgembed.catalog import registry

                with database.connect() as conn:
                    spec = registry.get(conn, "minilm")
                results["search"] = search.measure(database, spec, queries)
                print(report.search(results["search"]), flush=True)  # type: ignore[arg-type]
            if "latency" in only:
                results["latency_insert"] = latency.insert_to_searchable(
                    database, args.latency_samples
                )
                results["latency_update"] = latency.update_while_in_flight(database, 200)
                print(
                    report.latency(results["latency_insert"], results["latency_update"]),  # type: ignore[arg-type]
                    flush=True,
                )
            if "capture" in only:
                results["capture"] = capture.measure(database, args.bulk_rows, args.repeats)
                print(report.capture(results["capture"]), flush=True)  # type: ignore[arg-type]
            if "serve" in only:
                serve_queries = generated_corpus(serve.COLD_RUNS + args.serve_requests, seed=77)
                results["serve"] = serve.measure(database, texts, serve_queries, args.serve_rows)
                print(report.serve(results["serve"]), flush=True)  # type: ignore[arg-type]
            if "engines" in only:
                results["engines"] = engines.measure(texts, args.repeats, args.scifact)
                print(report.engines(results["engines"]), flush=True)  # type: ignore[arg-type]
            if "bigrow" in only:
                results["bigrow"] = bigrow.measure(database)
                print(report.bigrow(results["bigrow"]), flush=True)  # type: ignore[arg-type]
            if "indexpath" in only:
                index_path = indexpath.measure(database)
                print(indexpath.report(index_path[0]), flush=True)
            if "chunking" in only:
                chunked = chunking.measure(
                    database, args.scifact or chunking.SCIFACT, args.chunk_rows
                )
                print(chunking.report(chunked), flush=True)
            if "concurrency" in only:
                many = concurrency.measure(database, args.rows)
                print(concurrency.report(many), flush=True)
        finally:
            database.drop()
    command = "python -m bench " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    seconds = time.monotonic() - started
    text = report.document(results, machine(), command.strip(), args, seconds)
    serve_text = report.serve_document(results, machine(), command.strip(), seconds)
    bigrow_text = report.bigrow_document(results, machine(), command.strip(), seconds)
    engines_text = report.engines_document(results, machine(), command.strip(), seconds)
    # `--only serve` leaves the rest as it is
    main_ran = bool(only - OWN_SECTIONS)
    sections = (text if main_ran else None, serve_text, bigrow_text, engines_text)
    print("\n\n".join(t for t in sections if t))
    if index_path:
        index_text = indexpath.document(
            *index_path, machine(), command.strip(), results.get("postgres"), seconds
        )
        print("\n" + index_text)
    if chunked:
        chunk_text = chunking.document(
            chunked, machine(), command.strip(), results.get("postgres"), seconds
        )
        print("\n" + chunk_text)
    if many:
        many_text = concurrency.document(many, machine(), command.strip(), seconds)
        print("\n" + many_text)
    scale_text = None
    if scaled and "measured" in scaled:
        scale_text = searchscale.document(scaled, machine(), command.strip(), seconds)
        print("\n" + scale_text)
    if not args.no_write:
        if scale_text:
            report.write(Path("BENCHMARKS.md"), scale_text, searchscale.START, searchscale.END)
        if main_ran:
            report.write(Path("BENCHMARKS.md"), text)
        if serve_text:
            report.write(Path("BENCHMARKS.md"), serve_text, report.SERVE_START, report.SERVE_END)
        if bigrow_text:
            report.write(Path("BENCHMARKS.md"), bigrow_text, report.BIGROW_START, report.BIGROW_END)
        if engines_text:
            report.write(
                Path("BENCHMARKS.md"), engines_text, report.ENGINES_START, report.ENGINES_END
            )
        if index_path:
            report.write(Path("BENCHMARKS.md"), index_text, indexpath.START, indexpath.END)
        if chunked:
            report.write(Path("BENCHMARKS.md"), chunk_text, chunking.START, chunking.END)
        if many:
            report.write(Path("BENCHMARKS.md"), many_text, concurrency.START, concurrency.END)
    return 0


def _scale(args: argparse.Namespace, argv: list[str] | None) -> int:
    """`--only scale`: on a server of its own (--scale-home, or --database-url) that keeps the
    built datasets for the next run."""
    started = time.monotonic()
    args.scale_home.mkdir(parents=True, exist_ok=True)
    sizes = tuple(int(n) for n in args.scale_sizes.split(","))
    workers, results = scale.measure(
        args.scale_home, sizes, args.database_url, sync=not args.scale_no_sync
    )
    command = "python -m bench " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    text = scale.document(workers, results, machine(), command, time.monotonic() - started)
    print("\n" + text)
    if not args.no_write:
        report.write(Path("BENCHMARKS.md"), text, scale.START, scale.END)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
