from __future__ import annotations

import pytest

from pgembed import config
from pgembed.errors import ConfigError


def test_url_resolution_order(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PGEMBED_DATABASE_URL", "postgresql://a@h1/db")
    monkeypatch.setenv("DATABASE_URL", "postgresql://b@h2/db")
    assert config.database_url("postgresql://c@h3/db") == "postgresql://c@h3/db"
    assert config.database_url(None) == "postgresql://a@h1/db"
    monkeypatch.delenv("PGEMBED_DATABASE_URL")
    assert config.database_url(None) == "postgresql://b@h2/db"
    monkeypatch.delenv("DATABASE_URL")
    assert config.database_url(None) is None  # the embedded server


@pytest.mark.parametrize("url", ["mysql://x@h/db", "not a url", "postgresql://u@h:99999/db"])
def test_malformed_url_is_refused(url: str) -> None:
    with pytest.raises(ConfigError, match="malformed database URL"):
        config.validate_url(url)


def test_redact_hides_password() -> None:
    redacted = config.redact("postgresql://alice:s3cret@db.example:5432/app")
    assert "s3cret" not in redacted
    assert redacted == "postgresql://alice:***@db.example:5432/app"
    assert config.redact("postgresql://alice@db/app") == "postgresql://alice@db/app"


def test_home_honours_pgembed_home(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("PGEMBED_HOME", str(tmp_path / "h"))
    assert config.home() == (tmp_path / "h").resolve()
    assert (tmp_path / "h").is_dir()


def test_passwords_in_query_strings_and_keyword_strings_are_masked() -> None:
    assert config.redact("postgresql://h/db?password=secret&sslmode=require") == (
        "postgresql://h/db?password=***&sslmode=require"
    )
    assert "secret" not in config.redact("host=h password=secret dbname=x")
    assert "s3cr" not in config.redact("postgresql://bob:s3cr@h/db?password=s3cr")
    with pytest.raises(ConfigError) as err:
        config.validate_url("host=h password=secret")
    assert "secret" not in str(err.value)
