"""The views as the application configures them: the settings turned into the plain arguments
:mod:`derived_views` takes (it never reads :class:`~cdc.config.settings.Settings` itself).

Listing the views' tables (:func:`listed_tables`) imports no Spark: ``cdc lag`` and its exporter use it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from derived_views import LogLocation
from derived_views.definitions import load as load_definitions

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from cdc.config.settings import Settings
    from derived_views import ViewContext, ViewTable


def location_from_settings(settings: Settings) -> LogLocation:
    """The log the settings name: Kafka with ``CDC_LOG``, else ``<CDC_DATA_DIR>/log``."""
    if settings.uses_kafka:
        return LogLocation(kafka=settings.kafka_settings())
    return LogLocation(path=str(settings.log_dir.resolve()))


def context_from_settings(settings: Settings, spark: SparkSession | None = None, *, one_shot: bool = False) -> ViewContext:
    """A :class:`~derived_views.write.context.ViewContext` for the configured data directory, log and views
    file, in ``spark`` or a session of its own. ``one_shot``: the process runs one step and ends, so a
    driver it starts for a small step compiles with C1 alone (:mod:`derived_views.runs.job`)."""
    from derived_views import ViewContext, start_session

    definitions = load_definitions(settings.views_file)
    location = location_from_settings(settings)
    if spark is None:
        spark = start_session(location, settings.views_dir, settings.topic_prefix, one_shot=one_shot)
    return ViewContext(
        spark,
        str(settings.views_dir.resolve()),
        location,
        settings.topic_prefix,
        definitions=definitions,
        deletion_vectors=settings.deletion_vectors,
        change_data_feed=settings.change_data_feed,
    )


def listed_tables(settings: Settings, *, lenient: bool = False, health: bool = False) -> list[ViewTable]:
    """Every table of every view the settings' views file defines over the captured tables, with what
    each is as of (no Spark; ``lenient``: a views file that does not fit the source lists what it can;
    ``health``: with each table's files, size, versions and last maintenance)."""
    from derived_views import captured_tables, view_tables

    captured = captured_tables(location_from_settings(settings), settings.topic_prefix)
    definitions = load_definitions(settings.views_file)
    return view_tables(settings.views_dir.resolve(), captured, definitions, lenient=lenient, health=health)
