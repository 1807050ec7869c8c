from __future__ import annotations

import pytest

from pgembed import config, db
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


@pytest.mark.parametrize(
    ("url", "redacted"),
    [
        ("postgresql://u:pa@ss@h/db", "postgresql://u:***@h/db"),  # unencoded '@'
        ("postgresql://u:p/s?s#s@h:5/db", "postgresql://u:***@h:5/db"),  # '/', '?', '#'
        ("postgresql://u:@/db?host=/tmp/s", "postgresql://u:@/db?host=/tmp/s"),  # no password
        ("postgresql://u@h/db?user=me@corp", "postgresql://u@h/db?user=me@corp"),
        ("postgresql://h/db?a=1&password=x&b=2", "postgresql://h/db?a=1&password=***&b=2"),
        ("postgresql://h/db?password=x&y&b=2", "postgresql://h/db?password=***&b=2"),
        ("postgresql://h/db?Pass%77ord=x", "postgresql://h/db?Pass%77ord=***"),
        ("postgresql://h/db?sslpassword=x", "postgresql://h/db?sslpassword=***"),
        ("postgresql://h/db?passfile=/p", "postgresql://h/db?passfile=/p"),
        ("host=h password='a b\\'c' port=5", "host=h password=*** port=5"),
        ("host=h password = a b port=5", "host=h password = *** port=5"),
        ("host=h sslpassword=x", "host=h sslpassword=***"),
    ],
)
def test_redact_masks_every_form(url: str, redacted: str) -> None:
    assert config.redact(url) == redacted


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("postgresql://u:Hunter@Secret@h/db", "an '@' after the user name and password"),
        ("postgresql://u:12/HunterSecret@h/db", "an '@' after the user name and password"),
        ("postgresql://u:Hunter/Secret@h/db", "the port is not a number"),
        ("postgresql://u:HunterSecret@[::1/db", "a '[' or ']' of an IPv6 host without its pair"),
        ("postgresql://u:Hunter\uff20Secret@h/db", "the URL's host and user part is not valid"),
        ("postgresql://u:Hunter%zzSecret@h/db", 'invalid percent-encoded token: "..."'),
        ("postgresql://h/db?password=Hunter&Secret", 'in URI query parameter: "..."'),
    ],
)
def test_urls_libpq_would_misread_are_refused_without_quoting_them(url: str, reason: str) -> None:
    with pytest.raises(ConfigError) as err:
        config.validate_url(url)
    message = str(err.value)
    assert reason in message and "percent-encode @ : / ? # &" in message
    assert "Hunter" not in message and "Secret" not in message


def test_urls_libpq_reads_as_written_are_accepted() -> None:
    for url in (
        "postgresql://u:2024?pass@h/db",  # libpq ends the user part at the first '@'
        "postgresql://h1:5432,h2:5433/db",  # several hosts
        "postgresql://u:p%40ss@h/db?user=me@corp",
    ):
        assert config.validate_url(url) == url


def test_without_password_drops_it_from_the_user_part_and_the_query() -> None:
    url = "postgresql://u:p%40ss@h:5/db?sslmode=require&password=x&application_name=a"
    assert config.without_password(url) == (
        "postgresql://u@h:5/db?sslmode=require&application_name=a"
    )


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("postgres:Hunter2Secret@host/db", "no '//' after the scheme"),
        ("postgresql:/u:Hunter2Secret@host/db", "no '//' after the scheme"),
        ("postgresql//u:Hunter2Secret@host/db", "no ':' between the scheme and '//'"),
        ("host:5432:db:user:Hunter2Secret", "this is a .pgpass line"),
        ("*:*:*:user:Hunter2Secret", "this is a .pgpass line"),
        ("host=h password=Hunter2Secret", "a keyword connection string"),
        ("u:Hunter2Secret@host://db", "no postgresql:// scheme"),
        ("Hunter2Secret", "no postgresql:// scheme"),
    ],
)
def test_urls_without_a_scheme_say_why_and_quote_nothing(url: str, reason: str) -> None:
    with pytest.raises(ConfigError) as err:
        config.validate_url(url)
    message = str(err.value)
    assert reason in message and "write postgresql://user:password@host:port/dbname" in message
    assert "Hunter2Secret" not in message
    assert "Hunter2Secret" not in config.redact(url)


def test_libpq_complaints_lose_what_they_quote() -> None:
    with pytest.raises(ConfigError) as err:
        db.connect("postgresql://u@h/db?password=Hunter&2Secret")  # not through validate_url
    assert "in URI query parameter" in str(err.value)
    assert "Hunter2Secret" not in str(err.value)
