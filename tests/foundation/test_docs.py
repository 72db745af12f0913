"""The README and docs/ stay true: every link reaches a file (and heading), every file named exists, every
command shown exists, and the architecture map's tables hold short cells."""

from __future__ import annotations

import re
from pathlib import Path

import click
import pytest

from cdc.cli import _register_commands, cli

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
_COMMAND = re.compile(r"(?<![\w/.-])cdc((?: [a-z][a-z-]*)+)")
_SCRIPT = re.compile(r"\./(scripts/[\w-]+)")
#: A file or folder of the repository in backticks, maybe with a test after it: `tests/x/test_y.py::test_z`
_PATH = re.compile(
    r"`((?:bench|cdc|deploy|derived_views|docs|event_format|examples|local_servers|log_store|migrations|scripts|tests)"
    r"/[\w/.-]*)(?:::(\w+)[^`]*)?`"
)


def _anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    return {_anchor(line.lstrip("#")) for line in page.read_text().splitlines() if line.startswith("#")}


def _links(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)  # code blocks hold no links
    return [link for link in _LINK.findall(text) if not link.startswith(("http://", "https://", "mailto:"))]


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_every_link_reaches_a_file_and_its_heading(page: Path) -> None:
    links = _links(page)
    if page.name == "README.md":
        assert any(link.startswith("docs/") for link in links)  # the README points into docs/
    for link in links:
        path, _, anchor = link.partition("#")
        target = (page.parent / path).resolve() if path else page
        assert target.exists(), f"{page.name} links to {link}, which does not exist"
        if anchor:
            assert anchor in _anchors(target), f"{page.name} links to {link}: no such heading in {target.name}"


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_every_file_a_page_names_exists(page: Path) -> None:
    """A file moved or a test renamed leaves no page naming the old one."""
    named = _PATH.findall(page.read_text())
    for path, test in named:
        assert (ROOT / path).exists(), f"{page.name} names {path}, which does not exist"
        if test:
            assert f"def {test}(" in (ROOT / path).read_text(), f"{page.name} names {path}::{test}, which does not exist"


#: The longest a table cell of docs/architecture.md may be: a map's cell holds a line or two, and longer lists
#: (a promise's tests, a room's modules) go under a heading of their own below the table.
MAP_CELL_CHARS = 300


def _table_cells(page: Path) -> list[str]:
    """Every cell of every Markdown table in ``page`` (a ``\\|`` inside a cell does not split it)."""
    rows = [line.strip() for line in page.read_text().splitlines() if line.lstrip().startswith("|")]
    return [cell.strip() for row in rows for cell in re.split(r"(?<!\\)\|", row.strip("|"))]


def test_the_architecture_map_keeps_its_table_cells_short() -> None:
    page = ROOT / "docs" / "architecture.md"
    cells = _table_cells(page)
    assert any("`cdc/capture/`" in cell for cell in cells)  # the map's tables were found
    long = [f"{len(cell)} characters: {cell[:80]}..." for cell in cells if len(cell) > MAP_CELL_CHARS]
    assert long == [], f"docs/architecture.md has table cells over {MAP_CELL_CHARS} characters"


def _command_names() -> set[tuple[str, ...]]:
    """Every command path of the CLI: ``("setup",)``, ``("log", "tail")``, ..."""
    _register_commands()
    names: set[tuple[str, ...]] = set()

    def walk(group: click.Group, prefix: tuple[str, ...]) -> None:
        for name, command in group.commands.items():
            names.add((*prefix, name))
            if isinstance(command, click.Group):
                walk(command, (*prefix, name))

    walk(cli, ())
    return names


def test_every_command_the_readme_shows_exists() -> None:
    known = _command_names()
    text = (ROOT / "README.md").read_text()
    shown = {tuple(match.split()) for match in _COMMAND.findall(text)}
    assert ("setup",) in {words[:1] for words in shown}  # the pattern finds commands at all
    for words in shown:
        # "cdc log topics | describe": the longest prefix of words that names a command must name one
        assert any(words[:n] in known for n in range(1, len(words) + 1)), f"README shows `cdc {' '.join(words)}`"
    for group_line in re.findall(r"`cdc (\w+) ([a-z]+(?: \\\| [a-z]+)+)`", text):
        for sub in group_line[1].split(" \\| "):
            assert (group_line[0], sub) in known, f"README shows `cdc {group_line[0]} {sub}`"
    scripts = set(_SCRIPT.findall(text))
    assert scripts >= {"scripts/demo", "scripts/test"}
    for script in scripts:
        assert (ROOT / script).is_file(), f"README shows ./{script}"


def test_the_readme_introduces_and_stays_short() -> None:
    assert len((ROOT / "README.md").read_text().splitlines()) <= 150
