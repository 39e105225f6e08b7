"""Every `runfold <command> --option` the docs name is an option of that command.

The docs pages (docs/**/*.md) and the README are scanned for `runfold` command lines (in a code
span or a code block: `runfold` and a command name, then its words up to the end of the span,
the line, or a shell separator) and for options tables under a heading naming `runfold
COMMAND`; each `--option` found is looked up in the command's own `--help` (what `runfold
<command> --help` lists, the conformance kit's for `conformance`): an invented `--attr` fails,
naming the page and the line.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from runfold.cli import main as cli_main

ROOT = Path(__file__).resolve().parents[2]
PAGES = [*sorted((ROOT / "docs").rglob("*.md")), ROOT / "README.md"]
OPTION = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
# A command line: `runfold COMMAND`, then what follows up to a backtick, a pipe, `;`, `&&`, `#`
# (a shell comment) or the end of the line.
COMMAND_LINE = re.compile(r"(?<![\w./-])runfold ([a-z][a-z-]*)((?:[^`|;&#\n]|&(?!&))*)")


def _help(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert cli_main([*argv, "--help"]) == 0
    return capsys.readouterr().out


@pytest.fixture(scope="module")
def commands() -> dict[str, set[str]]:
    return {}  # filled on first use: the options of each command, from its --help


def options_of(
    command: str, known: dict[str, set[str]], capsys: pytest.CaptureFixture[str]
) -> set[str] | None:
    """The options `runfold COMMAND --help` lists; None for a word that is no command."""
    if not known:
        top = _help(capsys)
        listed = top.split("Commands:")[1].split("exit codes:")[0]
        names = re.findall(r"^ {2}([a-z][a-z-]*)", listed, re.MULTILINE)
        known.update({name: set() for name in names})
        known[""] = set(OPTION.findall(top.split("Commands:")[0]))
    if command not in known:
        return None
    if not known[command]:
        known[command] = set(OPTION.findall(_help(capsys, command))) | {"--help"}
    return known[command]


def named_options(text: str) -> list[tuple[int, str, str]]:
    """`(line number, command, --option)` for each option on a `runfold` command line or in an
    options table (its rows start with a code span of the option) under a `runfold` heading."""
    found = []
    section = None
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith("#"):
            heading = re.match(r"#+ `runfold ([a-z][a-z-]*)", line)
            section = heading.group(1) if heading else None
        if section is not None and line.startswith("| `--"):
            found.append((number, section, OPTION.findall(line)[0]))
            continue
        for match in COMMAND_LINE.finditer(line):
            for option in OPTION.findall(match.group(2)):
                found.append((number, match.group(1), option))
    return found


def test_the_scan_finds_options_and_stops_at_separators() -> None:
    text = (
        "run `runfold show RUN --json --store URL` then `--not-this`\n$ runfold ui --port 1 | x --y"
    )
    assert named_options(text) == [
        (1, "show", "--json"),
        (1, "show", "--store"),
        (2, "ui", "--port"),
    ]


def test_every_option_the_docs_name_exists(
    commands: dict[str, set[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    checked, wrong = 0, []
    for page in PAGES:
        for number, command, option in named_options(page.read_text()):
            options = options_of(command, commands, capsys)
            if options is None:  # `runfold flow`, `runfold and DBOS`: prose, not a command
                continue
            checked += 1
            if option not in options:
                wrong.append(f"{page.relative_to(ROOT)}:{number}: runfold {command} {option}")
    assert checked >= 50, checked  # the scan still finds the docs' command lines
    assert not wrong, "options the commands do not have:\n" + "\n".join(wrong)


def test_an_invented_option_is_caught(
    commands: dict[str, set[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    [(_, command, option)] = named_options("`runfold show RUN --attr stage=paid`")
    options = options_of(command, commands, capsys)
    assert options is not None and "--json" in options and option not in options
