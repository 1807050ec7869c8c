"""The CLI's help and docs/cli.md, walked from the click command tree (no database).

Summaries: `pgembed --help` (and a group's) shows each command's first sentence, which click
ends at the first word ending in a period: "Run STATEMENT (e.g." was one. No command's first
sentence may end in an abbreviation or an ellipsis, nor leave a parenthesis, bracket or
backtick open.

Options: every long option name (`--create-roles`, `--no-normalize`) of every command `--help`
lists must appear, as a whole word, in that command's part of docs/cli.md or in a doc file that
part links to. A command's part is each `##` section whose heading names it (a subcommand's
heading starts with its group, or is the group alone, as `## db`), or else the section with a line
that opens with its usage, `` `pgembed alter-table ``. The main group's own options
(`--database-url`, which every command also takes, and `--version`) may be anywhere in
docs/cli.md. Hidden commands and options are left out.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import click

from pgembed.cli import main

DOCS = Path(__file__).resolve().parents[2] / "docs"
CLI_MD = DOCS / "cli.md"
CUT_ENDINGS = ("e.g.", "i.e.", "cf.", "vs.", "...")
PAIRS = (("(", ")"), ("[", "]"))


def _commands(
    command: click.Command, path: tuple[str, ...] = (), hidden: bool = True
) -> Iterator[tuple[tuple[str, ...], click.Command]]:
    """Every command under `command` (itself first) with its path; `hidden=False`: those
    `--help` lists."""
    if command.hidden and not hidden:
        return
    yield path, command
    if isinstance(command, click.Group):
        for name, sub in command.commands.items():
            yield from _commands(sub, (*path, name), hidden)


def _sections() -> dict[str, str]:
    """docs/cli.md's `##` sections: heading -> body."""
    parts = re.split(r"(?m)^## ", CLI_MD.read_text(encoding="utf-8"))[1:]
    return {part.partition("\n")[0]: part.partition("\n")[2] for part in parts}


def _part(path: tuple[str, ...]) -> str:
    """The command's sections of docs/cli.md and the doc files they link, as one text."""
    sections = _sections()
    words = {heading: re.findall(r"[\w-]+", heading) for heading in sections}
    if len(path) == 2:
        group, name = path
        named = [h for h, w in words.items() if w[0] == group and (name in w or len(w) == 1)]
    else:
        named = [h for h, w in words.items() if path[0] in w]
    if not named:
        usage = re.compile(rf"(?m)^`pgembed {re.escape(' '.join(path))}\b")
        named = [h for h, body in sections.items() if usage.search(body)]
    assert named, f"`pgembed {' '.join(path)}` has no section in docs/cli.md"
    bodies = [sections[h] for h in named]
    links = {m for body in bodies for m in re.findall(r"\]\(([^)#\s]+\.md)", body)}
    return "\n".join([*bodies, *((DOCS / link).read_text(encoding="utf-8") for link in links)])


def _long_names(command: click.Command) -> list[str]:
    return [
        name
        for param in command.params
        if isinstance(param, click.Option) and not param.hidden
        for name in (*param.opts, *param.secondary_opts)
        if name.startswith("--") and name != "--help"
    ]


def _mentions(text: str, option: str) -> bool:
    return re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])", text) is not None


def test_no_command_summary_is_cut() -> None:
    summaries = {
        " ".join(("pgembed", *path)): command.get_short_help_str(limit=10**6)
        for path, command in _commands(main)
    }
    assert len(summaries) > 20 and all(summaries.values()), summaries
    cut = {
        name: summary
        for name, summary in summaries.items()
        if summary.endswith(CUT_ENDINGS)
        or any(summary.count(a) != summary.count(b) for a, b in PAIRS)
        or summary.count("`") % 2
    }
    assert cut == {}


def test_every_option_is_in_the_cli_docs() -> None:
    whole = CLI_MD.read_text(encoding="utf-8")
    own = _long_names(main)
    assert "--database-url" in own
    missing = [f"pgembed {option}" for option in own if not _mentions(whole, option)]
    checked = 0
    for path, command in _commands(main, hidden=False):
        if not path:
            continue
        names = [name for name in _long_names(command) if name not in own]
        text = _part(path)  # also: every command has its section
        missing += [f"pgembed {' '.join(path)} {n}" for n in names if not _mentions(text, n)]
        checked += len(names)
    assert checked > 60
    assert missing == []
