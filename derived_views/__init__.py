"""Derived views kept exact from the change log: the warehouse, search indexes and cache entities.

Every view table is a pure function of the log: ``cdc rebuild VIEW`` recreates it by replay.

Layers, each a subpackage with one job; a layer imports only the layers below it, and the package has
no import loop (``tests/foundation/test_layers.py`` checks both):

- :mod:`derived_views.errors` (what can go wrong) and :mod:`derived_views.definitions` (the views
  file): the package's vocabulary, which every layer may import;
- :mod:`derived_views.engine`: Spark and Delta sessions, jars, the driver JVM, Delta SQL, progress;
- :mod:`derived_views.events`: change events decoded, reduced per key and typed (pure logic);
- :mod:`derived_views.source`: reading the log (the ``cdclog`` data source, Kafka) and a table's pending batch;
- :mod:`derived_views.write`: the MERGE rules, SCD1 and SCD2 tables, one table's sync step;
- :mod:`derived_views.views`: the view kinds: the warehouse, search indexes, cache entities;
- :mod:`derived_views.runs`: how views are run: sync steps, continuous mode, rebuild, status, listing,
  reads as of one LSN, verify and purge.

This module is the package's public entry point: users' jobs import :func:`register` (the log as a
Spark source) and :func:`versions_as_of` (view tables read as of one LSN) from here, and the
application (``cdc``) imports the names of :data:`__all__` from here, and otherwise only :mod:`derived_views.errors` and
:mod:`derived_views.definitions`. Names are imported on first use, so that importing the package does
not import Spark.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from derived_views.engine.engine_settings import EngineSettings
    from derived_views.engine.maintenance import MaintenancePolicy
    from derived_views.engine.spark_jars import resolved_jars
    from derived_views.engine.spark_server import server_command, server_environment
    from derived_views.engine.table_health import TableHealth
    from derived_views.runs import runner
    from derived_views.runs.as_of_reads import VersionsAsOf, select_versions, versions_as_of
    from derived_views.runs.job import session_facts, start_session
    from derived_views.runs.listing import ViewTable, captured_tables, tables_of, view_as_of_lsn, view_tables
    from derived_views.runs.published_rules import published_rules
    from derived_views.runs.runner import StepReport
    from derived_views.runs.verify import shown, verify
    from derived_views.source.log_location import LogLocation
    from derived_views.source.log_source import register
    from derived_views.views import cache, search
    from derived_views.views.composite import SourceTable, checked
    from derived_views.write.context import ViewContext
    from derived_views.write.failures import read_all as read_failures

#: public name -> (module, name in it); a module itself when the name is ``None``
_EXPORTS: dict[str, tuple[str, str | None]] = {
    "register": ("derived_views.source.log_source", "register"),
    "LogLocation": ("derived_views.source.log_location", "LogLocation"),
    "ViewContext": ("derived_views.write.context", "ViewContext"),
    "start_session": ("derived_views.runs.job", "start_session"),
    "session_facts": ("derived_views.runs.job", "session_facts"),
    "runner": ("derived_views.runs.runner", None),
    "StepReport": ("derived_views.runs.runner", "StepReport"),
    "search": ("derived_views.views.search", None),
    "cache": ("derived_views.views.cache", None),
    "verify": ("derived_views.runs.verify", "verify"),
    "shown": ("derived_views.runs.verify", "shown"),
    "captured_tables": ("derived_views.runs.listing", "captured_tables"),
    "view_tables": ("derived_views.runs.listing", "view_tables"),
    "ViewTable": ("derived_views.runs.listing", "ViewTable"),
    "tables_of": ("derived_views.runs.listing", "tables_of"),
    "view_as_of_lsn": ("derived_views.runs.listing", "view_as_of_lsn"),
    "read_failures": ("derived_views.write.failures", "read_all"),
    "SourceTable": ("derived_views.views.composite", "SourceTable"),
    "checked": ("derived_views.views.composite", "checked"),
    "published_rules": ("derived_views.runs.published_rules", "published_rules"),
    "server_command": ("derived_views.engine.spark_server", "server_command"),
    "server_environment": ("derived_views.engine.spark_server", "server_environment"),
    "resolved_jars": ("derived_views.engine.spark_jars", "resolved_jars"),
    "EngineSettings": ("derived_views.engine.engine_settings", "EngineSettings"),
    "MaintenancePolicy": ("derived_views.engine.maintenance", "MaintenancePolicy"),
    "versions_as_of": ("derived_views.runs.as_of_reads", "versions_as_of"),
    "select_versions": ("derived_views.runs.as_of_reads", "select_versions"),
    "VersionsAsOf": ("derived_views.runs.as_of_reads", "VersionsAsOf"),
    "TableHealth": ("derived_views.engine.table_health", "TableHealth"),
}

__all__ = [
    "EngineSettings",
    "LogLocation",
    "MaintenancePolicy",
    "SourceTable",
    "StepReport",
    "TableHealth",
    "ViewContext",
    "VersionsAsOf",
    "ViewTable",
    "cache",
    "captured_tables",
    "checked",
    "published_rules",
    "read_failures",
    "register",
    "resolved_jars",
    "runner",
    "search",
    "select_versions",
    "server_command",
    "server_environment",
    "session_facts",
    "shown",
    "start_session",
    "tables_of",
    "verify",
    "versions_as_of",
    "view_as_of_lsn",
    "view_tables",
]


def __getattr__(name: str) -> Any:
    """Import a public name on first use (PEP 562)."""
    try:
        module, attribute = _EXPORTS[name]
    except KeyError:
        raise AttributeError(f"module 'derived_views' has no attribute {name!r}") from None
    value = import_module(module) if attribute is None else getattr(import_module(module), attribute)
    globals()[name] = value
    return value
