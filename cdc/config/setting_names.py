"""The ``CDC_*`` names the project reads, and one warning for any other: most likely a misspelled setting.

pydantic-settings ignores a variable it has no field for, so ``CDC_PARTITON=6`` would leave the
partition count at its default without a word. :func:`warn_of_unknown_names` names each such variable
(or ``.env`` entry) once per process on stderr, with the known name it most resembles, and fails nothing.
Names are compared in upper case, as the settings read them case-insensitively.
"""

from __future__ import annotations

import difflib
import os
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TextIO

from dotenv import dotenv_values

#: Variables read on purpose outside the settings classes (README: "Tooling variables"); the views'
#: engine reads its own (:class:`derived_views.EngineSettings`: the Spark master, Spark Connect server,
#: jars directory and class archive), which :func:`known_names` knows from its fields.
TOOLING: frozenset[str] = frozenset(
    {
        "CDC_KAFKA_JARS_DIR",  # local_servers.kafka: the test and demo broker's jars
        "CDC_PG_BINDIR",  # local_servers.postgres: PostgreSQL server binaries
        "CDC_TEST_DATABASE_URL",  # tests: the PostgreSQL the test suite uses
        "CDC_TEST_KAFKA",  # tests: a Kafka broker the test suite uses
    }
)

PREFIX = "CDC_"

_warned: set[str] = set()


def known_names(fields: Iterable[str]) -> list[str]:
    """``CDC_<FIELD>`` of every settings field and of the views' engine settings, and the tooling
    variables, sorted."""
    from derived_views import EngineSettings

    return sorted({PREFIX + field.upper() for field in [*fields, *EngineSettings.model_fields]} | TOOLING)


def unknown_names(known: Iterable[str], environ: Mapping[str, str], dotenv: Mapping[str, str | None]) -> dict[str, bool]:
    """Every ``CDC_*`` name in ``environ`` or ``dotenv`` that is not ``known``, and whether only ``dotenv`` has it."""
    names = set(known)
    found: dict[str, bool] = {}
    for in_dotenv, source in ((True, dotenv), (False, environ)):
        for name in source:
            if name.upper().startswith(PREFIX) and name.upper() not in names:
                found[name] = in_dotenv  # the environment wins over .env, as it does for the settings
    return found


def warn_of_unknown_names(fields: Iterable[str], env_file: Path | None, stream: TextIO | None = None) -> None:
    """Write one ``warning:`` line per unknown ``CDC_*`` name not warned of yet in this process."""
    known = known_names(fields)
    dotenv = dotenv_values(env_file) if env_file is not None and env_file.is_file() else {}
    for name, in_dotenv in sorted(unknown_names(known, os.environ, dotenv).items()):
        if name in _warned:
            continue
        _warned.add(name)
        (closest,) = difflib.get_close_matches(name.upper(), known, n=1, cutoff=0) or ("",)
        origin = f" (in {env_file})" if in_dotenv else ""
        print(f"warning: {name}{origin} is not a setting and is ignored; did you mean {closest}?", file=stream or sys.stderr)
