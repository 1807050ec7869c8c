"""An application that writes while pgembed changes its table: a process of its own (a thread
would share the GIL with a model's load) inserting a row into public.docs and committing every
20 ms; its slowest commit is what a `model add` or `model remove` cost it."""

from __future__ import annotations

import subprocess
import sys
import threading

WRITER = """
import sys, time, psycopg
url, key = sys.argv[1], int(sys.argv[2])
longest = 0.0
with psycopg.connect(url, autocommit=True) as app:
    app.execute("SET statement_timeout = '30s'")
    print("ready", flush=True)
    while not sys.stdin.readline().startswith("stop"):  # one line a commit: see Writer
        started = time.monotonic()
        app.execute("INSERT INTO public.docs VALUES (%s, 'written meanwhile ' || %s)", (key, key))
        longest = max(longest, time.monotonic() - started)
        key += 1
print(longest, key, flush=True)
"""


class Writer:
    """The application, in a process of its own (a thread here would share the GIL with the
    model's load): inserts a row and commits every 20 ms; `longest` is its slowest commit."""

    def __init__(self, url: str, first_id: int) -> None:
        self.longest = -1.0
        self._process = subprocess.Popen(
            [sys.executable, "-c", WRITER, url, str(first_id)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._pace)
        self.commits = 0

    def _pace(self) -> None:
        assert self._process.stdin is not None
        while not self._stop.wait(0.02):
            self._process.stdin.write("go\n")
            self._process.stdin.flush()
            self.commits += 1

    def __enter__(self) -> Writer:
        assert self._process.stdout is not None
        assert self._process.stdout.readline().strip() == "ready"
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join()
        out, _ = self._process.communicate("stop\n", timeout=60)
        self.longest = float(out.split()[0])
