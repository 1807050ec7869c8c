"""Bad input: one line on stderr, exit 1 (2 for usage), no traceback. Through the real executable
for each exit code and the environment's URL; the many other cases run the same click group in
this process (a process start is not their subject and cost 0.5-4 s each)."""

from __future__ import annotations

import psycopg
import pytest

from helpers import cli, run_cli, run_cli_here
from pgembed.encode import hardware
from pgembed.errors import ConfigError, UsageError


def assert_one_line_error(result: object, code: int, fragment: str) -> None:
    assert result.returncode == code, result.stderr  # type: ignore[attr-defined]
    lines = result.stderr.strip().splitlines()  # type: ignore[attr-defined]
    assert "Traceback" not in result.stderr  # type: ignore[attr-defined]
    assert len(lines) == 1 and lines[0].startswith("pgembed: error: "), lines
    assert fragment in lines[0]


@pytest.mark.parametrize(
    ("url", "fragment"),
    [
        ("mysql://bob:hunter2@db/app", "malformed database URL"),
        ("postgresql://bob:hunter2@127.0.0.1:99999/app", "malformed database URL"),
        ("postgresql://bob:hunter2@127.0.0.1:1/app", "cannot connect"),
    ],
)
def test_bad_urls_are_one_line_and_never_show_the_password(url: str, fragment: str) -> None:
    result = run_cli_here("--database-url", url, "status")
    assert_one_line_error(result, 1, fragment)
    assert "hunter2" not in result.stderr + result.stdout
    assert "bob:***@" in result.stderr


@pytest.mark.parametrize(
    "url", ["postgres:hunter2@db/app", "postgresql//bob:hunter2@db/app", "db:5432:app:bob:hunter2"]
)
def test_urls_without_a_scheme_never_show_the_password(url: str) -> None:
    result = run_cli_here("--database-url", url, "status")
    assert_one_line_error(result, 1, "malformed database URL (not shown): ")
    assert "hunter2" not in result.stderr + result.stdout


def test_url_from_environment_is_used_and_redacted() -> None:
    result = run_cli(
        "status", env={"PGEMBED_DATABASE_URL": "postgresql://bob:hunter2@127.0.0.1:1/x"}
    )
    assert_one_line_error(result, 1, "cannot connect to postgresql://bob:***@127.0.0.1:1/x")


def test_errors_against_a_real_database(reviews: psycopg.Connection, db_url: str) -> None:
    add = ["--database-url", db_url, "model", "add"]
    assert_one_line_error(
        run_cli_here(*add, "m", "--table", "nope", "--column", "body"), 1, "does not exist"
    )
    assert_one_line_error(
        run_cli_here(*add, "m", "--table", "reviews", "--column", "nope"), 1, "does not exist"
    )
    assert_one_line_error(
        run_cli_here(*add, "m", "--table", "reviews; drop table x", "--column", "body"),
        2,
        "invalid table name",
    )
    assert_one_line_error(
        run_cli_here(
            *add, "m", "--table", "reviews", "--column", "body", "--model", "/no/such/dir"
        ),
        1,
        "does not exist",
    )
    assert_one_line_error(
        run_cli_here(
            *add, "m", "--table", "reviews", "--column", "body", "--model", "org/not-cached"
        ),
        1,
        "offline",
    )
    assert_one_line_error(
        run_cli_here("--database-url", db_url, "query", "x", "--model", "ghost"), 1, "unknown model"
    )
    assert_one_line_error(
        run_cli_here("--database-url", db_url, "sync", "--once", "--model", "ghost"),
        1,
        "unknown model",
    )
    # Nothing was changed by any of them.
    assert reviews.execute("SELECT count(*) FROM pgembed.models").fetchone() == (0,)
    assert reviews.execute("SELECT count(*) FROM reviews").fetchone() == (8,)


@pytest.mark.parametrize(
    ("args", "said", "help"),
    [
        (
            ("query", "--model", "m", "-k", "0", "text"),
            "Invalid value for '-k': 0 is not in the range 1<=x<=1000",
            "query",
        ),
        (("model", "add", "x"), "Missing option '--table'", "model add"),
        (("query", "text"), "Missing option '--model'", "query"),
        (("--bogus", "status"), "No such option '--bogus'", ""),
        (("model", "addd"), "No such command 'addd'. Did you mean 'add'?", "model"),
        (("sync", "--claim-size", "0"), "Invalid value for '--claim-size': 0 is not in", "sync"),
    ],
)
def test_usage_errors_are_one_line_and_exit_2(args: tuple[str, ...], said: str, help: str) -> None:
    """click's own errors (option values, missing options, unknown commands) too: not its
    three lines of usage, hint and error; the line says where the help is."""
    result = run_cli_here(*args)
    assert_one_line_error(result, 2, said)
    assert result.stderr.strip().endswith(f"pgembed {help} --help`)".replace("  ", " "))


def test_a_group_without_its_command_shows_its_help() -> None:
    result = run_cli("model")
    assert result.returncode == 2 and "pgembed model [OPTIONS] COMMAND" in result.stderr


def test_bad_filter_from_the_real_executable(shop_url: str) -> None:
    proc = run_cli(
        "--database-url", shop_url, "query", "x", "--model", "minilm", "--filter", "{'a': 1}"
    )
    assert proc.returncode == 2
    assert proc.stderr.startswith("pgembed: error: --filter is not valid JSON")
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
    with psycopg.connect(shop_url) as conn:
        assert conn.execute("SELECT count(*) FROM reviews").fetchone() == (324,)


def test_device_auto_is_cpu_here_and_cuda_without_a_gpu_is_one_line(db_url: str) -> None:
    gpu = hardware.cuda_available()
    assert hardware.resolve_device("auto") == ("cuda" if gpu else "cpu")
    assert hardware.resolve_device("cpu") == "cpu"
    with pytest.raises(UsageError, match="invalid device 'tpu'"):
        hardware.resolve_device("tpu")
    if gpu:
        assert hardware.resolve_device("cuda") == "cuda"
        return
    with pytest.raises(ConfigError, match="no CUDA GPU"):
        hardware.resolve_device("cuda")
    result = run_cli_here("--database-url", db_url, "sync", "--once", "--device", "cuda")
    assert result.returncode == 1
    assert result.stderr.strip() == (
        "pgembed: error: --device cuda: no CUDA GPU is visible to torch on this machine"
    )
    bad = cli("--database-url", db_url, "sync", "--once", "--device", "tpu")
    assert bad.exit_code == 2
