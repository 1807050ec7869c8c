#!/usr/bin/env bash
# Issue 24 point 2 and issue 25 point 3 end to end, with the CLI as a user runs it: `model add`
# (precision auto) on 3,000 real reviews, `model add` on 1,000,000 rows, the time from starting
# `pgembed sync` on that backlog to its first vector written (process start, model load, claim,
# encode, write), and `pgembed status` at 1M. Usage: bench/first_vector.sh [reviews.csv.gz] [home]
# (a private embedded server under home; minutes, ~3 GB of disk).
set -euo pipefail
cd "$(dirname "$0")/.."
DATA=${1:-../shared/data/imdb-reviews/reviews.csv.gz}
export BENCH_DATA=$(realpath "$DATA")
export PGEMBED_HOME=${2:-/tmp/pgembed-first-vector}
PG=.venv/bin/pgembed
URL=$($PG db start 2>/dev/null | tail -1)
export PGEMBED_DATABASE_URL="$URL"
echo "url $URL"
$PG migrate >/dev/null
.venv/bin/python - <<'PY'
import gzip, csv, os, psycopg
url = os.environ["PGEMBED_DATABASE_URL"]
with psycopg.connect(url, autocommit=True) as c:
    c.execute("DROP TABLE IF EXISTS staging, reviews, small")
    c.execute("CREATE TABLE staging (n int, body text)")
    with gzip.open(os.environ["BENCH_DATA"], "rt") as f, c.cursor() as cur:
        with cur.copy("COPY staging FROM STDIN") as cp:
            for i, row in enumerate(csv.DictReader(f)):
                cp.write_row((i, row["text"].replace("<br />", " ")[:600]))
    c.execute("CREATE TABLE reviews (id bigint PRIMARY KEY, body text)")
    c.execute("INSERT INTO reviews SELECT g * 50000 + s.n, s.body FROM staging s, generate_series(0, 19) g")
    c.execute("CREATE TABLE small (id bigint PRIMARY KEY, body text)")
    c.execute("INSERT INTO small SELECT n, body FROM staging WHERE n < 3000")
    c.execute("VACUUM ANALYZE reviews")
    print("rows", c.execute("SELECT count(*) FROM reviews").fetchone())
PY
echo "== model add on 3,000 rows (precision auto), idle machine"
/usr/bin/time -f "model add small: %e s wall, %U s user" $PG model add small_minilm --table small --column body 2>&1 | tail -4
echo "== model add on 1M rows"
/usr/bin/time -f "model add 1M: %e s wall" $PG model add big --table reviews --column body --precision fp32 2>&1 | tail -3
.venv/bin/python - <<'PY'
import os, subprocess, time, psycopg
url = os.environ["PGEMBED_DATABASE_URL"]
with psycopg.connect(url, autocommit=True) as c:
    print("queued", c.execute("SELECT count(*) FROM pgembed.queue WHERE model = 'big'").fetchone())
    # stale statistics on purpose: what the queue looked like before the enqueue
    started = time.monotonic()
    p = subprocess.Popen([".venv/bin/pgembed", "sync", "--model", "big"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while True:
            n = c.execute("SELECT count(*) FROM (SELECT 1 FROM reviews WHERE embedding_big IS NOT NULL LIMIT 1) x").fetchone()[0]
            if n:
                print(f"first vector after {time.monotonic() - started:.1f} s (process start, model load, claim, encode, write)")
                break
            if time.monotonic() - started > 300:
                print("no vector within 300 s"); break
            time.sleep(0.2)
        time.sleep(20)
        done = c.execute("SELECT count(*) FROM pgembed.batches").fetchone()
        print("batches after 20 s more", done)
    finally:
        p.terminate(); p.wait(30)
PY
$PG status 2>&1 | tail -8
/usr/bin/time -f "status: %e s wall" $PG status >/dev/null
$PG db stop >/dev/null
