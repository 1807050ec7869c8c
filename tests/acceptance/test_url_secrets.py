"""No part of a password reaches the terminal, whatever the URL's form (issue 13, finding 4).

Each URL goes through the CLI, in this process (the click group the executable runs; a traceback
fails the test) and through the real executable for the environment's URLs; none reaches a server
(port 1 refuses at once), so every run ends in a one-line error that must not hold any fragment
of the password.
"""

from __future__ import annotations

import pytest

from helpers import run_cli, run_cli_here

FRAGMENTS = ("Hunter2", "Secret")  # a password is Hunter2Secret, or the two around a separator

URLS = [
    "postgresql://bob:Hunter2Secret@127.0.0.1:1/x",
    "postgresql://bob@127.0.0.1:1/x?password=Hunter2Secret",
    "postgresql://bob@127.0.0.1:1/x?sslmode=disable&password=Hunter2Secret&connect_timeout=5",
    "postgresql://bob@127.0.0.1:1/x?pass%77ord=Hunter2Secret",  # libpq decodes the key too
    "postgresql://bob@127.0.0.1:1/x?sslpassword=Hunter2Secret",
    "postgresql://bob@127.0.0.1:1/x?password=Hunter2&Secret",  # libpq: `Secret` has no '='
    "postgresql://bob:Hunter2@Secret@127.0.0.1:1/x",  # libpq: host 'Secret@127.0.0.1'
    "postgresql://bob:Hunter2/Secret@127.0.0.1:1/x",
    "postgresql://bob:Hunter2?Secret@127.0.0.1:1/x",
    "postgresql://bob:Hunter2#Secret@127.0.0.1:1/x",
    "postgresql://bob:2024?Hunter2Secret@127.0.0.1:1/x",  # libpq reads it (urlsplit does not)
    "postgresql://bob:Hunter2%zzSecret@127.0.0.1:1/x",  # libpq quotes a bad %-escape whole
    "host=127.0.0.1 port=1 password=Hunter2Secret",
    "host=127.0.0.1 port=1 password='Hunter2 Secret'",
    "host=127.0.0.1 port=1 password=Hunter2 Secret",
]


def assert_no_secret(result: object) -> None:
    out = result.stdout + result.stderr  # type: ignore[attr-defined]
    assert result.returncode != 0, out  # type: ignore[attr-defined]
    assert len(result.stderr.strip().splitlines()) == 1, out  # type: ignore[attr-defined]
    assert result.stderr.startswith("pgembed: error: "), out  # type: ignore[attr-defined]
    assert not [fragment for fragment in FRAGMENTS if fragment in out], out


@pytest.mark.parametrize("url", URLS)
def test_no_fragment_of_a_password_is_printed(url: str) -> None:
    assert_no_secret(run_cli_here("status", "--database-url", url))


def test_nor_from_the_environment() -> None:
    env = {"PGEMBED_DATABASE_URL": "postgresql://bob:Hunter2@Secret@127.0.0.1:1/x"}
    assert_no_secret(run_cli("status", env=env))
    env = {"PGEMBED_DATABASE_URL": "postgresql://bob@127.0.0.1:1/x", "PGPASSWORD": "Hunter2Secret"}
    assert_no_secret(run_cli("model", "list", env=env))


def test_db_url_masks_the_password_unless_asked() -> None:
    url = "postgresql://bob:Hunter2Secret@127.0.0.1:1/x?password=Hunter2Secret"
    masked = run_cli_here("db", "url", "--database-url", url)
    assert masked.returncode == 0
    assert masked.stdout == "postgresql://bob:***@127.0.0.1:1/x?password=***\n"
    shown = run_cli_here("db", "url", "--database-url", url, "--show-password")
    assert shown.returncode == 0 and shown.stdout == url + "\n"
