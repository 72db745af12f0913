"""The import graph is layered: the application (``cdc/``) uses capture (``cdc/capture/``), the views
(``derived_views/``), the change event's format (``event_format/``) and the log (``log_store/``);
capture and the views use the format and the log; the format uses only the log's error for a refused
fold; the log imports none of them (the fold reaches it as a setting). No module imports a layer above
it, at module level or inside a function."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: package -> the first-party packages it must never import
FORBIDDEN = {
    "log_store": ("cdc", "derived_views", "event_format"),
    "event_format": ("cdc", "derived_views"),
    "derived_views": ("cdc",),
}


def _imports(path: Path) -> list[tuple[int, str]]:
    """Every module ``path`` imports (absolute imports; the project uses no relative ones), with its line."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.append((node.lineno, node.module))
    return found


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_a_lower_layer_never_imports_a_higher_one(package: str) -> None:
    modules = sorted((ROOT / package).rglob("*.py"))
    assert modules, f"no modules under {ROOT / package}"
    wrong = [
        f"{path.relative_to(ROOT)}:{line} imports {name}"
        for path in modules
        for line, name in _imports(path)
        if name.split(".")[0] in FORBIDDEN[package]
    ]
    assert wrong == []


def test_capture_never_imports_the_application_around_it() -> None:
    """``cdc/capture/`` is below the application in ``cdc/`` (its CLI, settings and the run that ties
    capture to them): it imports only itself, the event format and the log."""
    modules = sorted((ROOT / "cdc" / "capture").rglob("*.py"))
    assert modules, "no modules under cdc/capture"
    wrong = [
        f"{path.relative_to(ROOT)}:{line} imports {name}"
        for path in modules
        for line, name in _imports(path)
        if name.split(".")[0] in ("cdc", "derived_views") and not name.startswith("cdc.capture")
    ]
    assert wrong == []
