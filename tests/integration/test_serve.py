"""`pgembed serve`'s HTTP API, in-process on a free port, through a real HTTP client (urllib):
the hits equal search/planner's for the same request; every error is a status and one line.
(tests/integration/test_serve_load.py runs `pgembed serve` as a process under many clients.)"""

from __future__ import annotations

import http.client
import json
import logging
import os
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from html.parser import HTMLParser
from typing import Any

import psycopg
import pytest
from psycopg import sql
from roles_helpers import as_role, role_maker

from helpers import REVIEWS, cli, database_name, search_on, with_database
from pgembed import db
from pgembed.catalog import registry
from pgembed.errors import UsageError
from pgembed.lifecycle import models
from pgembed.search import planner, vectors
from pgembed.serve import api as serve_api
from pgembed.serve.api import Api
from pgembed.serve.server import SearchServer
from pgembed.sync import worker

TIMEOUT = 60  # seconds for any one request


def call(url: str, body: object = None, *, raw: bytes | None = None) -> tuple[int, Any]:
    """GET (no body) or POST (JSON `body`, or `raw` bytes): the status and the decoded JSON."""
    data = raw if raw is not None else None if body is None else json.dumps(body).encode()
    headers = {} if data is None else {"Content-Type": "application/json"}
    request = urllib.request.Request(url, data=data, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT) as response:
            status, payload, kind = response.status, response.read(), response.headers
    except urllib.error.HTTPError as error:
        status, payload, kind = error.code, error.read(), error.headers
        error.close()
    if kind.get_content_type() != "application/json":
        return status, payload.decode()
    return status, json.loads(payload)


@pytest.fixture
def server(shop_url: str) -> Iterator[SearchServer]:
    api = Api(shop_url)
    api.acquire_timeout = 2.0  # the 503 test waits this long for a connection
    api.warm()
    served = SearchServer(api, "127.0.0.1", 0)
    served.start()
    try:
        yield served
    finally:
        served.stop()


@pytest.fixture
def shop(shop_url: str) -> Iterator[tuple[psycopg.Connection, registry.ModelSpec]]:
    with db.connection(shop_url) as conn:
        yield conn, registry.get(conn, "minilm")


def as_json(hits: list[planner.Hit] | list[planner.HybridHit]) -> list[dict[str, Any]]:
    return [asdict(hit) for hit in hits]


QUERIES = ["battery dies fast", "crisp sweet apples", "arrived late and the box was crushed"]


def test_hits_equal_the_helpers(
    server: SearchServer, shop: tuple[psycopg.Connection, registry.ModelSpec]
) -> None:
    conn, spec = shop
    for text in QUERIES:
        status, answer = call(f"{server.url}/search", {"text": text, "model": "minilm"})
        assert status == 200, answer
        assert answer["model"] == "minilm" and answer["took_ms"] > 0
        assert answer["hits"] == as_json(planner.query(conn, spec, text))  # k defaults to 10
        assert len(answer["hits"]) == 10


def test_k_filter_hybrid_similar_to_and_ef_search(
    server: SearchServer, shop: tuple[psycopg.Connection, registry.ModelSpec]
) -> None:
    conn, spec = shop
    url, text = f"{server.url}/search", "the battery does not last"
    ratings = {"rating": {"$gte": 4}}
    status, answer = call(url, {"text": text, "model": "minilm", "k": 3, "filter": ratings})
    assert status == 200 and answer["hits"] == as_json(planner.query(conn, spec, text, 3, ratings))
    keys = [hit["key"] for hit in answer["hits"]]
    rows = conn.execute("SELECT rating FROM reviews WHERE id = ANY(%s)", (keys,)).fetchall()
    assert len(keys) == 3 and all(rating >= 4 for (rating,) in rows)

    status, answer = call(url, {"text": text, "model": "minilm", "k": 4, "hybrid": True})
    assert status == 200 and answer["hits"] == as_json(
        search_on(conn, spec, text=text, hybrid=True, k=4)
    )
    assert set(answer["hits"][0]) == {"key", "score", "text"}

    for key in (5, "5"):  # a key as the column's JSON type, or as text
        status, answer = call(url, {"similar_to": key, "model": "minilm", "k": 3})
        assert status == 200 and answer["hits"] == as_json(search_on(conn, spec, similar_to=5, k=3))
        assert 5 not in [hit["key"] for hit in answer["hits"]]

    body = {"text": text, "model": "minilm", "k": 5, "ef_search": 200}
    status, answer = call(url, body)
    assert status == 200
    assert answer["hits"] == as_json(planner.query(conn, spec, text, 5, ef_search=200))


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def test_models_healthz_and_one_log_line_per_request(server: SearchServer) -> None:
    logger, lines = logging.getLogger("pgembed.serve"), Lines()
    level = logger.level
    logger.addHandler(lines)
    logger.setLevel(logging.INFO)
    try:
        status, answer = call(f"{server.url}/models")
        assert status == 200
        assert answer == {
            "models": [
                {
                    "name": "minilm",
                    "table": "public.reviews",
                    "column": "text",
                    "columns": ["text"],
                    "key": "id",
                    "dimensions": 384,
                    "pooling": "mean",
                    "model_ref": "all-MiniLM-L6-v2",
                }
            ]
        }
        assert call(f"{server.url}/healthz") == (200, {"status": "ok", "models": ["minilm"]})
        call(f"{server.url}/search", {"text": "", "model": "minilm"})
    finally:
        logger.removeHandler(lines)
        logger.setLevel(level)
    assert [line.rsplit(" ", 1)[0] for line in lines.lines] == [
        "GET /models 200",
        "GET /healthz 200",
        "POST /search 400",
    ]
    assert all(line.endswith("ms") for line in lines.lines)


BAD_REQUESTS: list[tuple[object, int, str]] = [
    ({"text": "", "model": "minilm"}, 400, '"text" is empty'),
    ({"text": "   ", "model": "minilm"}, 400, '"text" is empty'),
    ({"text": "\u200b\u200b", "model": "minilm"}, 400, '"text" is empty'),
    ({"model": "minilm"}, 400, 'give either "text" or "similar_to"'),
    ({"text": "x", "similar_to": 1, "model": "minilm"}, 400, 'give either "text" or'),
    ({"text": 3, "model": "minilm"}, 400, '"text" must be a string'),
    ({"text": "x"}, 400, '"model" is required'),
    ({"text": "x", "model": "minilm", "k": 0}, 400, '"k" must be an integer from 1 to 1000'),
    ({"text": "x", "model": "minilm", "k": 1001}, 400, '"k" must be an integer'),
    ({"text": "x", "model": "minilm", "k": "3"}, 400, '"k" must be an integer'),
    ({"text": "x", "model": "minilm", "k": True}, 400, '"k" must be an integer'),
    ({"text": "x", "model": "minilm", "filter": "rating"}, 400, '"filter" must be a JSON object'),
    ({"text": "x", "model": "minilm", "filter": {"nope": 1}}, 400, 'has no column "nope"'),
    ({"text": "x", "model": "minilm", "filter": {"rating": {"$in": 3}}}, 400, "$in needs"),
    ({"text": "x", "model": "minilm", "filter": {"rating": "high"}}, 400, "invalid input"),
    ({"text": "x", "model": "minilm", "hybrid": "yes"}, 400, '"hybrid" must be true or false'),
    ({"similar_to": 5, "model": "minilm", "hybrid": True}, 400, '"hybrid" needs "text"'),
    ({"text": "x", "model": "minilm", "top_k": 3}, 400, "unknown field 'top_k'"),
    (["battery"], 400, "the body must be a JSON object"),
    ({"text": "x", "model": "nope"}, 404, "unknown model 'nope'"),
    ({"text": "x", "model": "minlm"}, 404, "unknown model 'minlm': did you mean 'minilm'?"),
    ({"similar_to": 99999, "model": "minilm"}, 404, "has no row with id"),
]


@pytest.mark.parametrize(("body", "status", "message"), BAD_REQUESTS)
def test_bad_requests(server: SearchServer, body: object, status: int, message: str) -> None:
    got, answer = call(f"{server.url}/search", body)
    assert (got, set(answer)) == (status, {"error"}), answer
    assert message in answer["error"] and "\n" not in answer["error"]


def test_errors_outside_search_are_json_too(server: SearchServer) -> None:
    url = server.url
    status, answer = call(f"{url}/search", raw=b'{"text": "x", "model": ')
    assert status == 400 and answer["error"].startswith("the body is not valid JSON")
    status, answer = call(f"{url}/search", raw=b"\xff\xfe")
    assert status == 400 and answer["error"].startswith("the body is not valid JSON")
    status, answer = call(f"{url}/search", raw=b"[" * 100_000)  # RecursionError in json
    assert (status, answer) == (
        400,
        {"error": "the body is not valid JSON: it is nested too deeply"},
    )
    assert call(f"{url}/nope")[0] == 404
    assert call(f"{url}/search/", {"text": "x", "model": "minilm"}) == (
        404,
        {"error": "no such endpoint '/search/': see GET /, /models, /healthz"},
    )
    assert call(f"{url}/search") == (405, {"error": "/search takes POST"})
    assert call(f"{url}/models", {"text": "x"}) == (405, {"error": "/models takes GET"})
    big = http.client.HTTPConnection("127.0.0.1", server.port, timeout=TIMEOUT)
    try:  # the headers alone: the server answers before any of the body arrives
        big.putrequest("POST", "/search")
        big.putheader("Content-Length", str(2 << 20))
        big.endheaders()
        response = big.getresponse()
        answer = json.loads(response.read())
        assert response.status == 413 and "larger than" in answer["error"]
    finally:
        big.close()
    other = http.client.HTTPConnection("127.0.0.1", server.port, timeout=TIMEOUT)
    try:  # a method no route has
        other.request("PUT", "/search", b"{}")
        response = other.getresponse()
        assert response.status == 405 and "error" in json.loads(response.read())
    finally:
        other.close()
    with socket.create_connection(("127.0.0.1", server.port), timeout=TIMEOUT) as raw:
        raw.sendall(b"GET / HTTP/1.x\r\n\r\n")  # a malformed request line: the HTTP parser's
        reply = raw.makefile("rb").read()
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400") and b"application/json" in head
    assert set(json.loads(body)) == {"error"}
    # the server is still well after all of it
    assert call(f"{url}/search", {"text": "x", "model": "minilm", "k": 1})[0] == 200


def test_database_down_is_503_and_the_server_recovers(server: SearchServer, shop_url: str) -> None:
    name = database_name(shop_url)
    admin = psycopg.connect(with_database(shop_url, "postgres"), autocommit=True)
    body = {"text": "battery dies fast", "model": "minilm", "k": 3}
    try:
        admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (name,)
        )
        status, answer = call(f"{server.url}/search", body)
        assert status == 503 and answer["error"].startswith("database unavailable"), answer
        assert call(f"{server.url}/healthz")[0] == 503
    finally:
        admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
        admin.close()
    for _ in range(30):  # the pool reconnects in the background, backing off
        status, answer = call(f"{server.url}/search", body)
        if status == 200:
            break
        threading.Event().wait(1.0)
    assert status == 200 and len(answer["hits"]) == 3


def test_every_connection_in_use_is_503_busy(
    server: SearchServer, shop_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """8 searches wait on a lock, holding the pool's 8 connections: a 9th gets no connection
    within the timeout and hears that the server is busy, not that the database is down; the
    log has the pool's figures."""
    body = {"text": "battery dies fast", "model": "minilm", "k": 3}
    with psycopg.connect(shop_url) as locker, ThreadPoolExecutor(8) as pool:
        locker.execute("LOCK TABLE reviews IN ACCESS EXCLUSIVE MODE")
        held = [pool.submit(call, f"{server.url}/search", body) for _ in range(serve_api.POOL_SIZE)]
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline:
            waiting = locker.execute(
                "SELECT count(*) FROM pg_locks WHERE relation = 'reviews'::regclass AND NOT granted"
            ).fetchone()
            if waiting and waiting[0] >= serve_api.POOL_SIZE:
                break
            time.sleep(0.1)
        with ThreadPoolExecutor(4) as asking:  # at once: each waits out the acquire timeout
            searched = asking.submit(call, f"{server.url}/search", body)
            asked = {p: asking.submit(call, f"{server.url}{p}") for p in ("/healthz", "/models")}
            page = asking.submit(call, f"{server.url}/")
            status, answer = searched.result()
            others = {path: future.result() for path, future in asked.items()}
            _, home = page.result()
        locker.rollback()  # the lock goes: the 8 are answered
        first = [future.result() for future in held]
    assert status == 503, answer
    assert answer["error"].startswith("the server is busy: all 8 of its database connections")
    for path, (code, said) in others.items():  # the database is fine: these say so too
        assert code == 503, (path, said)
        assert said["error"].startswith("the server is busy: all 8"), (path, said)
    assert '<span id="down-why">the server is busy: all 8' in home, home
    assert [s for s, _ in first] == [200] * serve_api.POOL_SIZE
    said = [r.getMessage() for r in caplog.records if r.name == "pgembed.serve"]
    assert any(m.startswith("no database connection free within 2 s: {") for m in said), said


def test_a_search_past_the_statement_timeout_is_504_and_frees_its_connection(
    shop_url: str,
) -> None:
    """A search that waits on a lock for longer than the server's statement timeout is stopped:
    a 504 that names the timeout, no statement left waiting, and the next search is answered."""
    api = Api(shop_url, statement_timeout=0.5)
    api.warm()
    served = SearchServer(api, "127.0.0.1", 0)
    served.start()
    body = {"text": "battery dies fast", "model": "minilm", "k": 3}
    try:
        with psycopg.connect(shop_url) as locker:
            locker.execute("LOCK TABLE reviews IN ACCESS EXCLUSIVE MODE")
            stopped = call(f"{served.url}/search", body)
            waiting = locker.execute(
                "SELECT count(*) FROM pg_locks WHERE relation = 'reviews'::regclass AND NOT granted"
            ).fetchone()
            locker.rollback()
        answered = call(f"{served.url}/search", body)
    finally:
        served.stop()
    assert stopped[0] == 504, stopped
    assert "statement timeout" in stopped[1]["error"], stopped
    assert "statement timeout: 0.5 s" in stopped[1]["error"], stopped
    assert waiting == (0,)
    assert answered[0] == 200 and len(answered[1]["hits"]) == 3, answered


def test_a_cancel_that_is_not_the_timeout_is_not_called_one_and_bad_timeouts_are_refused(
    server: SearchServer, shop_url: str
) -> None:
    """An administrator's pg_cancel_backend is not the statement timeout (a review saw it
    answered 504 and blamed on the timeout); a timeout PostgreSQL cannot take is refused at
    once (beyond 2^31 - 1 ms, every connection failed its setup: 503s for ever)."""
    body = {"text": "battery dies fast", "model": "minilm", "k": 3}
    with psycopg.connect(shop_url, autocommit=True) as locker, ThreadPoolExecutor(1) as pool:
        locker.execute("BEGIN")
        locker.execute("LOCK TABLE reviews IN ACCESS EXCLUSIVE MODE")
        waiting = pool.submit(call, f"{server.url}/search", body)
        deadline = time.monotonic() + TIMEOUT
        cancelled = (False,)
        while time.monotonic() < deadline and cancelled != (True,):
            cancelled = locker.execute(
                "SELECT bool_or(pg_cancel_backend(pid)) FROM pg_locks "
                "WHERE relation = 'reviews'::regclass AND NOT granted"
            ).fetchone() or (False,)
            time.sleep(0.05)
        locker.execute("ROLLBACK")
        status, answer = waiting.result()
    assert status == 503 and "due to user request" in answer["error"], answer
    for bad in (-1, 2147484.0, float("nan")):
        with pytest.raises(UsageError, match="statement_timeout must be a number from 0 to"):
            Api(shop_url, statement_timeout=bad)
    result = cli("--database-url", shop_url, "serve", "--statement-timeout", "3000000")
    assert result.exit_code == 2 and "3000000" in result.output, result.output


def test_a_privilege_the_role_lacks_is_403(shop_url: str) -> None:
    """A reader role without SELECT on a filtered column: 403 with PostgreSQL's one line, not
    503, which clients retry for ever."""
    with role_maker(shop_url) as make:
        role = make("serve_reader")
        with db.connection(shop_url) as conn:
            for grant in (
                "GRANT USAGE ON SCHEMA pgembed TO {}",
                "GRANT SELECT ON pgembed.models, pgembed.migrations, pgembed.definitions TO {}",
                "GRANT SELECT (id, text, embedding_minilm) ON reviews TO {}",
            ):
                conn.execute(sql.SQL(grant).format(sql.Identifier(role)))
        served = SearchServer(Api(as_role(shop_url, role)), "127.0.0.1", 0)
        served.start()
        try:
            body = {"text": "battery dies fast", "model": "minilm", "k": 3}
            plain = call(f"{served.url}/search", body)
            denied = call(f"{served.url}/search", {**body, "filter": {"rating": {"$gte": 4}}})
        finally:
            served.stop()
    assert plain[0] == 200 and len(plain[1]["hits"]) == 3, plain
    assert denied == (403, {"error": "permission denied for table reviews"})


def test_concurrent_requests(
    server: SearchServer, shop: tuple[psycopg.Connection, registry.ModelSpec]
) -> None:
    conn, spec = shop
    texts = [
        f"{subject} {verdict}"
        for subject in ("battery", "screen", "delivery", "apples")
        for verdict in ("is great", "broke after a week", "was late")
    ]
    want = {text: as_json(planner.query(conn, spec, text, k=5)) for text in texts}
    url = f"{server.url}/search"

    def ask(text: str) -> tuple[str, int, Any]:
        status, answer = call(url, {"text": text, "model": "minilm", "k": 5})
        return text, status, answer

    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(ask, texts * 3))
    assert len(results) == 3 * len(texts)
    for text, status, answer in results:
        assert status == 200 and answer["hits"] == want[text]


class Form(HTMLParser):
    """The page's form: action, method, and each field's name -> value (a select's selected
    option) and options; plus every attribute that would load something from elsewhere."""

    def __init__(self) -> None:
        super().__init__()
        self.action = self.method = ""
        self.fields: dict[str, str] = {}
        self.options: dict[str, list[str]] = {}
        self.external: list[str] = []
        self._select: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        for attr in ("src", "href"):
            if attr in a:
                self.external.append(a[attr])
        if tag == "form":
            self.action, self.method = a.get("action", ""), a.get("method", "get")
        elif tag == "input" and a.get("type") != "checkbox":
            self.fields[a["name"]] = a.get("value", "")
        elif tag == "input":
            self.options[a["name"]] = [a.get("value", "on")]
        elif tag == "select":
            self._select = a["name"]
            self.options[a["name"]] = []
        elif tag == "option" and self._select is not None:
            self.options[self._select].append(a.get("value", ""))
            if "selected" in a or self._select not in self.fields:
                self.fields[self._select] = a.get("value", "")

    def handle_endtag(self, tag: str) -> None:
        if tag == "select":
            self._select = None


def test_search_page_posts_its_fields_side_by_side(server: SearchServer, shop_url: str) -> None:
    """A second model (CLS pooling on a small table) for the second column, as the demo shows
    two poolings side by side."""
    with db.connection(shop_url) as conn:
        conn.execute("CREATE TABLE notes (id integer PRIMARY KEY, body text)")
        with conn.cursor() as cur:
            cur.executemany("INSERT INTO notes VALUES (%s, %s)", REVIEWS)
        request = models.AddRequest("notes_cls", "notes", "body", pooling="cls", precision="fp32")
        models.add(conn, request)
    worker.Worker(shop_url, worker.Options(once=True)).run()

    status, html = call(f"{server.url}/")
    assert status == 200 and "<title>pgembed search</title>" in html
    form = Form()
    form.feed(html)
    # no external script, style, font or image (the icon is the server's own /favicon.svg)
    assert form.external == ["/favicon.svg"]
    assert "<script src" not in html and "@import" not in html and "url(" not in html
    assert (form.action, form.method) == ("/search", "post")
    assert set(form.fields) == {"text", "model", "compare", "filter", "k", "similar_to"}
    assert form.options["model"] == ["minilm", "notes_cls"]
    assert form.options["compare"] == ["", "minilm", "notes_cls"]
    assert (form.fields["model"], form.fields["compare"]) == ("minilm", "notes_cls")
    assert form.options["hybrid"] == ["true"]

    # What the page's script sends for each column: the form's fields, the text typed in.
    fields = {**form.fields, "text": "my phone runs out of power by noon"}
    fields["filter"] = '{"id": {"$lte": 300}}'
    with db.connection(shop_url) as conn:
        for model in (fields["model"], fields["compare"]):
            body = {
                "text": fields["text"],
                "model": model,
                "k": int(fields["k"]),
                "filter": json.loads(fields["filter"]),
            }
            status, answer = call(f"{server.url}{form.action}", body)
            assert status == 200 and answer["model"] == model
            spec = registry.get(conn, model)
            want = planner.query(conn, spec, body["text"], 10, {"id": {"$lte": 300}})
            assert answer["hits"] == as_json(want)
            assert len(want) == (10 if model == "minilm" else len(REVIEWS))


def test_one_keep_alive_connection_through_errors(server: SearchServer) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=TIMEOUT)
    good = json.dumps({"text": "battery", "model": "minilm", "k": 2}).encode()
    try:
        for method, path, body, status in [
            ("POST", "/search", good, 200),
            ("POST", "/search", b"{not json", 400),
            ("GET", "/models", b'{"ignored": "body"}', 200),  # a body nobody reads is skipped
            ("POST", "/nope", b"{}", 404),
            ("POST", "/search", good, 200),
        ]:
            conn.request(method, path, body, {"Content-Type": "application/json"})
            response = conn.getresponse()
            answer = json.loads(response.read())
            assert response.status == status, answer
            assert response.getheader("Connection") != "close"
    finally:
        conn.close()


def test_a_foreign_host_is_421(server: SearchServer) -> None:
    """DNS rebinding: a page of evil.example resolved to 127.0.0.1 sends its own name as Host."""
    for host in ("evil.example", f"evil.example:{server.port}", "127.0.0.1.evil.example"):
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=TIMEOUT)
        try:
            conn.request("GET", "/models", headers={"Host": host})
            response = conn.getresponse()
            answer = json.loads(response.read())
            assert response.status == 421 and set(answer) == {"error"}, answer
            assert answer["error"] == (
                "this server answers only for Host 127.0.0.1, [::1], localhost (see docs/serve.md)"
            )
        finally:
            conn.close()
    for host in ("localhost", f"localhost:{server.port}", f"127.0.0.1:{server.port}", "[::1]"):
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=TIMEOUT)
        try:
            conn.request("GET", "/healthz", headers={"Host": host})
            response = conn.getresponse()
            assert response.status == 200, response.read()
            response.read()
        finally:
            conn.close()
    assert call(f"{server.url}/search", {"text": "x", "model": "minilm", "k": 1})[0] == 200


def status_for_host(server: SearchServer, host: str) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=TIMEOUT)
    try:
        conn.request("GET", "/healthz", headers={"Host": host})
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


def test_allowed_hosts_keep_the_check_on_any_address(shop_url: str) -> None:
    """Compose's `serve --host 0.0.0.0 --allow-host localhost ...`: bound to every interface (so
    the published port reaches it), it still refuses a rebound name."""
    allowed = ("localhost", "127.0.0.1", "serve")
    checked = SearchServer(Api(shop_url), "0.0.0.0", 0, allowed_hosts=allowed)
    open_to_all = SearchServer(Api(shop_url), "0.0.0.0", 0)  # an Api serves one event loop
    for served in (checked, open_to_all):
        served.start()
    try:
        for host in ("localhost", f"localhost:{checked.port}", "127.0.0.1:8765", "serve:8765"):
            assert status_for_host(checked, host) == 200, host
        for host in ("evil.example", f"evil.example:{checked.port}", "[::1]x"):
            assert status_for_host(checked, host) == 421, host
        assert status_for_host(open_to_all, "evil.example") == 200  # no list: no check
        conn = http.client.HTTPConnection("127.0.0.1", checked.port, timeout=TIMEOUT)
        conn.request("GET", "/healthz", headers={"Host": "evil.example"})
        refused = json.loads(conn.getresponse().read())
        conn.close()
        assert refused == {
            "error": "this server answers only for Host 127.0.0.1, localhost, serve "
            "(see docs/serve.md)"
        }
    finally:
        for served in (checked, open_to_all):
            served.stop()


def test_no_connection_is_held_while_a_query_is_encoded(
    shop_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With one connection in the pool, a search stuck in encoding (a model loading) leaves it
    free for other requests; `stop` waits for the search in flight."""
    monkeypatch.setattr(serve_api, "POOL_SIZE", 1)
    encoding, release = threading.Event(), threading.Event()
    real = vectors.embed_queries

    def slow(settings: Any, texts: list[str]) -> Any:
        encoding.set()
        release.wait(TIMEOUT)
        return real(settings, texts)

    monkeypatch.setattr(vectors, "embed_queries", slow)  # the batcher's encode (in a thread)
    api = Api(shop_url)
    api.acquire_timeout = 2.0
    served = SearchServer(api, "127.0.0.1", 0)
    served.start()
    try:
        with ThreadPoolExecutor(max_workers=2) as pool:
            body = {"text": "a battery not in the query cache", "model": "minilm", "k": 2}
            searching = pool.submit(call, f"{served.url}/search", body)
            assert encoding.wait(TIMEOUT)
            assert call(f"{served.url}/healthz")[0] == 200
            assert call(f"{served.url}/models")[0] == 200
            stopping = pool.submit(served.stop)
            threading.Event().wait(0.5)
            assert not stopping.done() and not searching.done()
            release.set()
            status, answer = searching.result(TIMEOUT)
            stopping.result(TIMEOUT)
        assert status == 200 and len(answer["hits"]) == 2
    finally:
        release.set()
        served.stop()


def raw_request(port: int, head: bytes, body: bytes = b"") -> tuple[int, dict[str, str], bytes]:
    """One request written by hand; the status, headers and body of the answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT) as sock:
        sock.sendall(head + body)
        response = http.client.HTTPResponse(sock)
        response.begin()
        return response.status, dict(response.getheaders()), response.read()


def until_closed(sock: socket.socket) -> bytes:
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def test_each_head_of_a_keep_alive_connection_is_checked(shop_url: str) -> None:
    """serve/front.py: a second request's head not whole in time is a 408 (counted from its
    first byte); one the parser cannot read, sent before the first request's answer, is a JSON
    400 after that answer, not within it."""
    served = SearchServer(Api(shop_url), "127.0.0.1", 0, head_seconds=1.0)
    served.start()
    get = b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n"
    try:
        with socket.create_connection(("127.0.0.1", served.port), timeout=TIMEOUT) as sock:
            sock.sendall(get)
            first = http.client.HTTPResponse(sock)  # reads this one answer, not beyond
            first.begin()
            assert first.status == 200 and json.loads(first.read())["status"] == "ok"
            time.sleep(1.5)  # idle between requests: keep-alive's time, not the head's
            started = time.monotonic()
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: loc")
            late = until_closed(sock)
            took = time.monotonic() - started
        head, _, body = late.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 408 ") and b"application/json" in head, late
        assert json.loads(body) == {"error": "the request's headers did not arrive within 1 s"}
        assert 0.9 < took < 10, took
        # After an answered CONNECT (a 405; h11 takes a 2xx to it for a switch of protocol),
        # the next head is still held to its time.
        with socket.create_connection(("127.0.0.1", served.port), timeout=TIMEOUT) as sock:
            sock.sendall(b"CONNECT /search HTTP/1.1\r\nHost: localhost\r\n\r\n")
            connect = http.client.HTTPResponse(sock, method="CONNECT")
            connect.begin()
            assert connect.status in (404, 405), connect.status
            connect.read()
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: loc")
            assert until_closed(sock).startswith(b"HTTP/1.1 408 ")
        with socket.create_connection(("127.0.0.1", served.port), timeout=TIMEOUT) as sock:
            sock.sendall(get + b"GET / HTTP/1.x\r\n\r\n")
            both = until_closed(sock)
        answered, bad = both.split(b"HTTP/1.1 400 ")
        assert answered.startswith(b"HTTP/1.1 200 ") and b'"status":' in answered, both
        assert json.loads(bad.partition(b"\r\n\r\n")[2])["error"].startswith("invalid HTTP")
    finally:
        served.stop()


def test_a_short_body_a_lone_surrogate_and_a_filter_type_error(shop_url: str) -> None:
    """Issue 26's: a body shorter than its Content-Length is a quick 408, not a 500 after 30 s;
    a lone surrogate in any field is a 400, not a 500; a filter comparing a column with a value
    of a type it has no operator for is a 400, not a 503 (the database is fine)."""
    with db.connection(shop_url) as conn:
        conn.execute("ALTER TABLE reviews ADD COLUMN meta json")
    api = Api(shop_url)
    served = SearchServer(api, "127.0.0.1", 0, body_seconds=1.0)
    served.start()
    try:
        head = (
            b"POST /search HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: 50\r\n\r\n"
        )
        started = time.monotonic()
        status, _, body = raw_request(served.port, head, b'{"text": "x"')
        assert status == 408 and "Content-Length" in json.loads(body)["error"]
        assert time.monotonic() - started < 10
        url = f"{served.url}/search"
        for payload in (
            b'{"text": "battery", "model": "mini\\ud800lm"}',
            b'{"similar_to": "\\udfff", "model": "minilm"}',
            b'{"text": "battery", "model": "minilm", "filter": {"product": "\\ud800"}}',
        ):
            status, answer = call(url, raw=payload)
            assert status == 400 and "lone surrogate" in answer["error"], answer
        # a JSON number keeps its digits (a float read it as 4.5, 1e400 as infinity)
        with db.connection(shop_url) as conn:
            conn.execute("ALTER TABLE reviews ADD COLUMN price numeric")
            conn.execute("UPDATE reviews SET price = 4.5 + (id % 2) * 1e-17")
        for filter, odd in [(b'{"price": 4.50000000000000001}', [1]), (b'{"price": 1e400}', [])]:
            payload = b'{"text": "battery", "model": "minilm", "k": 50, "filter": ' + filter + b"}"
            status, answer = call(url, raw=payload)
            assert status == 200, answer
            assert {hit["key"] % 2 for hit in answer["hits"]} == set(odd), answer
        huge = b'{"text": "battery", "model": "minilm", "k": 1e9999999999999999999}'
        status, answer = call(url, raw=huge)  # no Decimal holds it: not a 500
        assert status == 400 and "is out of range" in answer["error"], answer
        json_filter = {"text": "battery", "model": "minilm", "filter": {"meta": {"a": 1}}}
        status, answer = call(url, json_filter)
        assert status == 400 and "\n" not in answer["error"], answer
        assert call(url, {"text": "battery", "model": "minilm", "k": 1})[0] == 200
    finally:
        served.stop()


def test_only_json_from_the_same_origin_is_searched(server: SearchServer) -> None:
    """A web page of another origin can POST text/plain or a form without asking the browser
    first: refused, as is a request a browser marks cross-site."""
    good = json.dumps({"text": "battery", "model": "minilm", "k": 1}).encode()
    host = f"127.0.0.1:{server.port}"
    base = f"POST /search HTTP/1.1\r\nHost: {host}\r\nContent-Length: {len(good)}\r\n"
    for extra, status in [
        ("Content-Type: text/plain\r\n", 415),
        ("Content-Type: application/x-www-form-urlencoded\r\n", 415),
        ("", 415),
        ("Content-Type: application/json\r\nOrigin: http://evil.example\r\n", 403),
        ("Content-Type: application/json\r\nSec-Fetch-Site: cross-site\r\n", 403),
        (f"Content-Type: application/json\r\nOrigin: http://{host}\r\n", 200),
        ("Content-Type: application/json; charset=utf-8\r\nSec-Fetch-Site: same-origin\r\n", 200),
    ]:
        got, _, body = raw_request(server.port, (base + extra + "\r\n").encode(), good)
        assert got == status, (extra, body)


def test_security_headers_favicon_metrics_and_rows(server: SearchServer) -> None:
    status, headers, body = raw_request(server.port, b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n")
    assert status == 200 and b"<title>pgembed search</title>" in body
    csp = headers["content-security-policy"]
    assert "default-src 'none'" in csp and "frame-ancestors 'none'" in csp
    assert "'unsafe-inline'" not in csp
    assert headers["x-frame-options"] == "DENY"
    assert headers["x-content-type-options"] == "nosniff"
    assert headers["referrer-policy"] == "no-referrer"
    status, headers, icon = raw_request(
        server.port, b"GET /favicon.svg HTTP/1.1\r\nHost: localhost\r\n\r\n"
    )
    assert status == 200 and headers["content-type"] == "image/svg+xml" and b"<svg" in icon
    status, answer = call(f"{server.url}/metrics")
    assert status == 200 and set(answer["batching"]) >= {"queries", "batches", "largest"}
    status, answer = call(
        f"{server.url}/search", {"text": "battery", "model": "minilm", "k": 3, "row": True}
    )
    assert status == 200 and len(answer["hits"]) == 3
    for hit in answer["hits"]:  # the row's other columns: not the key, the text, the vectors
        assert set(hit["row"]) == {"product", "category", "rating"}, hit


def test_the_page_loads_while_the_database_is_down(server: SearchServer, shop_url: str) -> None:
    name = database_name(shop_url)
    admin = psycopg.connect(with_database(shop_url, "postgres"), autocommit=True)
    try:
        admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (name,)
        )
        status, html = call(f"{server.url}/")
        assert status == 200 and "<title>pgembed search</title>" in html
        assert 'id="down"' in html and "database unavailable" in html
    finally:
        admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
        admin.close()


def test_replies_go_out_without_waiting_for_a_delayed_ack(server: SearchServer) -> None:
    """Every accepted connection is TCP_NODELAY: else a reply's headers and body, two writes,
    wait for the client's delayed ACK between them (+40 ms on each request of a keep-alive
    client). Read from the server's own socket of this connection (the server is in-process)."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        conn.request("GET", "/healthz")
        conn.getresponse().read()
        client_port = conn.sock.getsockname()[1]
        nodelay = []
        for fd in os.listdir("/proc/self/fd"):
            try:
                sock = socket.socket(fileno=os.dup(int(fd)))
            except OSError:
                continue  # not a socket
            with sock:
                try:
                    peer = sock.getpeername()
                except OSError:
                    continue
                if sock.family == socket.AF_INET and peer[1] == client_port:
                    nodelay.append(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
        assert nodelay == [1], nodelay  # the server's end of this one connection
    finally:
        conn.close()


@pytest.mark.parametrize(
    ("key_type", "keys"),
    [
        ("timestamptz", ["2021-03-19 00:15:23.5+00", "2021-03-19 00:15:24+00"]),
        ("float8", ["1", "2.5e-07"]),
        ("bytea", ["\\x0102", "\\xff"]),
    ],
)
def test_rows_are_found_for_keys_whose_text_python_writes_otherwise(
    shop_url: str, key_type: str, keys: list[str]
) -> None:
    """A hit's "row" was matched by text: PostgreSQL's `1` and `...23.5+00` against Python's
    `1.0` and `...23.500000+00:00` found nothing, and the hit came back with an empty row."""
    with db.connection(shop_url) as conn:
        conn.execute(
            sql.SQL("CREATE TABLE keyed (k {} PRIMARY KEY, body text, rating int)").format(
                sql.SQL(key_type)
            )
        )
        for n, key in enumerate(keys, start=1):
            conn.execute(
                "INSERT INTO keyed VALUES (%s, %s, %s)", (key, f"A great movie, part {n}", n)
            )
    assert (
        cli(
            "--database-url",
            shop_url,
            "model",
            "add",
            "keyed",
            "--table",
            "keyed",
            "--column",
            "body",
        ).exit_code
        == 0
    )
    worker.Worker(shop_url, worker.Options(once=True)).run()
    served = SearchServer(Api(shop_url), "127.0.0.1", 0)
    served.start()
    try:
        status, answer = call(
            f"{served.url}/search", {"text": "a great movie", "model": "keyed", "k": 2, "row": True}
        )
        # a key as shown is one similar_to reads back (a bytea's was Python's b'...')
        first, second = (hit["key"] for hit in answer["hits"])
        like = call(f"{served.url}/search", {"similar_to": first, "model": "keyed", "k": 1})
    finally:
        served.stop()
    assert status == 200, answer
    assert sorted(hit["row"]["rating"] for hit in answer["hits"]) == [1, 2], answer
    assert like[0] == 200 and [hit["key"] for hit in like[1]["hits"]] == [second], like
    args = ["--database-url", shop_url, "query", "--model", "keyed", "-k", "2"]
    printed = cli(*args, "a great movie").output.splitlines()
    assert [line.split("\t")[0] for line in printed] == [str(first), str(second)], printed
    as_json = json.loads(cli(*args, "--json", "a great movie").output)
    assert [hit["key"] for hit in as_json] == [first, second], as_json
