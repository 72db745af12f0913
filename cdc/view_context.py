"""The views as the application configures them: the settings turned into the plain arguments
:mod:`derived_views` takes (it never reads :class:`~cdc.settings.Settings` itself)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from derived_views.context import ViewContext
from derived_views.definitions import load as load_definitions
from derived_views.log_location import LogLocation

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from cdc.settings import Settings


def location_from_settings(settings: Settings) -> LogLocation:
    """The log the settings name: Kafka with ``CDC_LOG``, else ``<CDC_DATA_DIR>/log``."""
    if settings.uses_kafka:
        return LogLocation(kafka=settings.kafka_settings())
    return LogLocation(path=str(settings.log_dir.resolve()))


def context_from_settings(settings: Settings, spark: SparkSession | None = None) -> ViewContext:
    """A :class:`~derived_views.context.ViewContext` for the configured data directory, log and views file,
    in ``spark`` or a session of its own."""
    from derived_views.spark_session import build_spark

    definitions = load_definitions(settings.views_file)
    session = spark or build_spark("cdc-views")
    return ViewContext(session, str(settings.views_dir.resolve()), location_from_settings(settings), settings.topic_prefix,
                       definitions=definitions, deletion_vectors=settings.deletion_vectors)
