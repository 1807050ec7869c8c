"""The Docker files keep what docs/docker.md promises (no Docker engine runs where tests run)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

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
    assert "model add minilm --table reviews --column body" in text
    docs = (ROOT / "docs" / "docker.md").read_text()
    assert "model add minilm --table reviews --column body" in docs
