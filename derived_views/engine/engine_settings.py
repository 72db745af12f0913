"""The engine's own settings: which Spark to run on and where its jars are, read from ``CDC_*`` variables.

The engine runs under ``cdc`` and without it (a ``spark-submit`` job, a user's session given the
``cdclog`` source, set-up making the class archive), and :mod:`derived_views` may not import ``cdc``, so
it reads these few settings itself, typed, in this one class; nothing else in the package reads the
environment for a ``CDC_*`` name. ``cdc``'s settings class leaves these names to it, and the
application's check of misspelled names knows them from :data:`EngineSettings.model_fields`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

#: Values of ``CDC_CLASS_ARCHIVE`` that turn the class archive off (any other value keeps it on)
_OFF = frozenset({"off", "0", "false", "no"})


class EngineSettings(BaseSettings):
    """``CDC_SPARK_MASTER``, ``CDC_SPARK_REMOTE``, ``CDC_SPARK_JARS_DIR`` and ``CDC_CLASS_ARCHIVE``,
    read from the environment each time an instance is made (so a changed variable is seen)."""

    model_config = SettingsConfigDict(env_prefix="CDC_", extra="ignore")

    spark_master: str = "local[2]"
    """The Spark master a session this process starts runs on (``spark-submit`` gives its own)."""
    spark_remote: str | None = None
    """A Spark Connect server (``sc://host:port``) the view commands attach to instead of starting Spark."""
    spark_jars_dir: Path | None = None
    """Where the resolved Delta and Kafka source jars live; default ``<virtualenv>/jars``."""
    class_archive: bool = True
    """Whether a driver JVM maps the class archive set-up made (``off`` turns it off)."""

    @field_validator("spark_remote", mode="before")
    @classmethod
    def _blank_is_none(cls, value: Any) -> Any:
        return (value.strip() or None) if isinstance(value, str) else value

    @field_validator("class_archive", mode="before")
    @classmethod
    def _off_or_on(cls, value: Any) -> Any:
        return value if isinstance(value, bool) else str(value).strip().lower() not in _OFF

    @field_validator("spark_jars_dir", mode="before")
    @classmethod
    def _empty_is_default(cls, value: Any) -> Any:
        return None if value == "" else value


def engine_settings() -> EngineSettings:
    """The engine's settings as the environment holds them now."""
    return EngineSettings()
