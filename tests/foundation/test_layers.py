"""The import graph is layered: the application (``cdc/``) uses capture (``cdc/capture/``), the views
(``derived_views/``), the change event's format (``event_format/``) and the log (``log_store/``);
capture and the views use the format and the log; the format uses only the log's error for a refused
fold; the log imports none of them (the fold reaches it as a setting). No module imports a layer above
it, at module level or inside a function.

Inside ``cdc/`` the application's rooms are layers too (:data:`APP_ROOMS`), and no module of ``cdc`` or
``local_servers`` is on an import loop.

Inside ``derived_views/`` the subpackages are layers too (:data:`VIEW_LAYERS`, lowest first), with no
import loop between its modules; the application reaches the views only through the package's entry
point (``derived_views/__init__.py``) and the two modules every layer shares (:data:`VIEW_SHARED`)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: package -> the first-party packages it must never import
FORBIDDEN = {
    "log_store": ("cdc", "derived_views", "event_format", "local_servers"),
    "event_format": ("cdc", "derived_views", "local_servers"),
    "derived_views": ("cdc", "local_servers"),
    "local_servers": ("cdc", "derived_views"),
}


#: ``derived_views``' layers, lowest first: a module may import its own layer and the ones before it
VIEW_LAYERS = ("engine", "events", "source", "write", "views", "runs")
#: modules of ``derived_views`` every layer, and the application, may import: the package's errors
#: and the views file
VIEW_SHARED = ("derived_views.errors", "derived_views.definitions")


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
    capture to them): it imports only itself, the event format, the log and the application's root errors
    (``cdc.errors``)."""
    modules = sorted((ROOT / "cdc" / "capture").rglob("*.py"))
    assert modules, "no modules under cdc/capture"
    wrong = [
        f"{path.relative_to(ROOT)}:{line} imports {name}"
        for path in modules
        for line, name in _imports(path)
        if name.split(".")[0] in ("cdc", "derived_views") and not name.startswith("cdc.capture") and name != "cdc.errors"
    ]
    assert wrong == []


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _package_modules(package: str) -> dict[str, Path]:
    return {_module_name(path): path for path in sorted((ROOT / package).rglob("*.py"))}


def _imported_modules(path: Path, known: dict[str, Path]) -> Iterator[tuple[int, str]]:
    """The modules of ``known`` that ``path`` imports, with the line: ``from a.b import c`` names the
    module ``a.b.c`` when there is one, else ``a.b``."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, alias.name) for alias in node.names if alias.name in known)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                if submodule in known:
                    yield node.lineno, submodule
                elif node.module in known:
                    yield node.lineno, node.module


def _view_layer(module: str) -> int | None:
    """The rank of ``module``'s layer in :data:`VIEW_LAYERS`; ``-1`` for a shared module, ``None`` for the
    package's entry point (which may import every layer)."""
    parts = module.split(".")
    if module in VIEW_SHARED:
        return -1
    if len(parts) > 1 and parts[1] in VIEW_LAYERS:
        return VIEW_LAYERS.index(parts[1])
    return None


def _view_graph() -> dict[str, set[str]]:
    modules = _package_modules("derived_views")
    return {name: {imported for _, imported in _imported_modules(path, modules)} - {name} for name, path in modules.items()}


def test_every_view_module_is_in_a_layer() -> None:
    """A new module of ``derived_views`` goes into one of the layers (or is the package's entry point)."""
    loose = [name for name in _package_modules("derived_views") if name != "derived_views" and _view_layer(name) is None]
    assert loose == []


def test_a_view_layer_never_imports_a_higher_one() -> None:
    modules = _package_modules("derived_views")
    wrong = [
        f"{path.relative_to(ROOT)}:{line} imports {imported}"
        for name, path in modules.items()
        if (rank := _view_layer(name)) is not None
        for line, imported in _imported_modules(path, modules)
        if (target := _view_layer(imported)) is None or target > rank
    ]
    assert wrong == []


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every import loop a depth-first walk of ``graph`` meets (one per back edge), as the modules on it."""
    cycles: list[list[str]] = []
    state: dict[str, str] = {}
    path: list[str] = []

    def visit(module: str) -> None:
        state[module] = "open"
        path.append(module)
        for imported in sorted(graph.get(module, ())):
            if state.get(imported) == "open":
                cycles.append([*path[path.index(imported) :], imported])
            elif imported not in state:
                visit(imported)
        path.pop()
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module)
    return cycles


def test_import_cycles_are_found() -> None:
    """The walk itself: a loop through three modules is reported, a diamond is not."""
    assert import_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]
    assert import_cycles({"a": {"b", "c"}, "b": {"d"}, "c": {"d"}, "d": set()}) == []


def test_no_import_loop_inside_the_views() -> None:
    """No module of ``derived_views`` imports, directly or through others, one that imports it (at module
    level, inside a function, or for type checking alike)."""
    assert import_cycles(_view_graph()) == []


def test_no_import_loop_in_the_application_or_the_local_servers() -> None:
    """No module of ``cdc`` or ``local_servers`` imports, directly or through others, one that imports it
    (at module level, inside a function, or for type checking alike)."""
    modules = {**_package_modules("cdc"), **_package_modules("local_servers")}
    graph = {name: {imported for _, imported in _imported_modules(path, modules)} - {name} for name, path in modules.items()}
    assert import_cycles(graph) == []


#: the application's rooms (``cdc/<room>/``), lowest first: a module may import its own room and the ones
#: before it, besides ``cdc.errors`` and ``cdc.capture``
APP_ROOMS = ("config", "setup", "observe", "run", "commands")
#: the application's modules outside the rooms: the root errors and the entry points above every room
APP_ROOT = ("cdc", "cdc.errors", "cdc.cli", "cdc.spark_job")


def _app_room(module: str) -> int | None:
    """The rank of ``module``'s room in :data:`APP_ROOMS`; ``-1`` for ``cdc.errors`` and capture, ``None``
    for the entry points."""
    parts = module.split(".")
    if module == "cdc.errors" or parts[:2] == ["cdc", "capture"]:
        return -1
    if len(parts) > 1 and parts[1] in APP_ROOMS:
        return APP_ROOMS.index(parts[1])
    return None


def test_every_application_module_is_in_a_room() -> None:
    loose = [name for name in _package_modules("cdc") if name not in APP_ROOT and _app_room(name) is None]
    assert loose == []


def test_an_application_room_never_imports_a_higher_one() -> None:
    modules = _package_modules("cdc")
    wrong = [
        f"{path.relative_to(ROOT)}:{line} imports {imported}"
        for name, path in modules.items()
        if (rank := _app_room(name)) is not None and rank >= 0
        for line, imported in _imported_modules(path, modules)
        if (target := _app_room(imported)) is None or target > rank
    ]
    assert wrong == []


def test_the_application_uses_the_views_through_their_entry_point() -> None:
    """``cdc/`` imports ``derived_views`` itself (names of its ``__all__``) and the shared modules, never
    a layer's module: the layers may move without the application noticing."""
    import derived_views

    wrong = []
    for path in sorted((ROOT / "cdc").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            where = f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.Import):
                wrong += [f"{where} imports {a.name}" for a in node.names if a.name.startswith("derived_views")]
            elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "derived_views":
                if node.module == "derived_views":
                    wrong += [f"{where} imports {a.name}, not public" for a in node.names if a.name not in derived_views.__all__]
                elif node.module not in VIEW_SHARED:
                    wrong.append(f"{where} imports {node.module}")
    assert wrong == []


def test_the_entry_point_resolves_every_public_name() -> None:
    import derived_views

    assert sorted(derived_views.__all__) == sorted(derived_views._EXPORTS)
    missing = [name for name in derived_views.__all__ if getattr(derived_views, name, None) is None]
    assert missing == []
    with pytest.raises(AttributeError, match="no attribute 'spark_session'"):
        derived_views.spark_session  # noqa: B018 - the attribute access is the test


#: Modules of the product that read ``CDC_*`` variables from the environment: the application's
#: settings class and the views' engine settings (the engine runs without ``cdc`` too). The throwaway
#: servers of the demo and the tests (``local_servers/``, no product package) read tooling variables.
READS_CDC_ENVIRONMENT = ("cdc/config/settings.py", "derived_views/engine/engine_settings.py")


def _environment_reads(path: Path) -> Iterator[tuple[int, str]]:
    """``os.environ.get("CDC_...")``, ``os.environ["CDC_..."]`` and ``os.getenv("CDC_...")`` in ``path``."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        name: ast.expr | None = None
        if isinstance(node, ast.Call) and node.args:
            target = ast.unparse(node.func)
            if target in ("os.environ.get", "os.getenv", "environ.get", "getenv"):
                name = node.args[0]
        elif isinstance(node, ast.Subscript) and ast.unparse(node.value) in ("os.environ", "environ"):
            if isinstance(node.ctx, ast.Load):
                name = node.slice
        if isinstance(name, ast.Constant) and isinstance(name.value, str) and name.value.startswith("CDC_"):
            yield node.lineno, name.value


def test_cdc_settings_are_read_only_through_the_settings_classes() -> None:
    """A ``CDC_*`` setting is read by :class:`cdc.config.settings.Settings` or, for the Spark the views run on, by
    :class:`derived_views.engine.engine_settings.EngineSettings`: typed, checked, and known to the
    misspelled-name warning; no other module of the product reads one from the environment."""
    wrong = [
        f"{path.relative_to(ROOT)}:{line} reads {name}"
        for package in ("cdc", "derived_views", "log_store", "event_format")
        for path in sorted((ROOT / package).rglob("*.py"))
        if str(path.relative_to(ROOT)) not in READS_CDC_ENVIRONMENT
        for line, name in _environment_reads(path)
    ]
    assert wrong == []


def test_the_engine_settings_are_known_names() -> None:
    """The names the engine reads are known to the application's check of misspelled names."""
    from cdc.config.setting_names import known_names
    from derived_views.engine.engine_settings import EngineSettings

    known = known_names([])
    assert [f"CDC_{field.upper()}" for field in EngineSettings.model_fields if f"CDC_{field.upper()}" not in known] == []


def test_only_the_demo_starts_local_servers() -> None:
    """``local_servers/`` holds the throwaway PostgreSQL and Kafka of the demo, the tests and the benchmarks:
    of the product, only ``cdc demo`` uses them."""
    modules = sorted((ROOT / "cdc").rglob("*.py"))
    assert modules, "no modules under cdc"
    users = sorted(
        str(path.relative_to(ROOT)) for path in modules for _, name in _imports(path) if name.split(".")[0] == "local_servers"
    )
    assert users == ["cdc/commands/demo_cmd.py"]
