"""Apply the project's Alembic migrations (reference schema and CDC bootstrap) to a database."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy.exc import OperationalError

import migrations
from cdc.capture.errors import SourceError
from cdc.config.redact import redact_url

MIGRATIONS_DIR = Path(migrations.__file__).parent


def sqlalchemy_url(url: str) -> str:
    """The same database as a SQLAlchemy URL that uses the psycopg 3 driver."""
    for scheme in ("postgresql://", "postgres://"):
        if url.startswith(scheme):
            return "postgresql+psycopg://" + url[len(scheme) :]
    return url


def alembic_config(url: str, *, role: str = "cdc_reader", publication: str = "cdc_publication") -> Config:
    """An Alembic config pointing at ``migrations/`` and ``url``; no alembic.ini needed."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.set_main_option("sqlalchemy.url", sqlalchemy_url(url).replace("%", "%%"))
    config.attributes["cdc_role"] = role
    config.attributes["cdc_publication"] = publication
    return config


def upgrade(url: str, revision: str = "head", *, publication: str = "cdc_publication") -> None:
    """Bring the database at ``url`` to ``revision`` (idempotent: applied revisions are skipped)."""
    try:
        command.upgrade(alembic_config(url, publication=publication), revision)
    except OperationalError as exc:
        raise SourceError(
            f"cannot migrate {redact_url(url)}: {str(exc.orig or exc).strip().splitlines()[0]}; "
            "check CDC_DATABASE_URL and that the server accepts connections"
        ) from None


def downgrade(url: str, revision: str, *, publication: str = "cdc_publication") -> None:
    """Step the database at ``url`` back to ``revision``."""
    command.downgrade(alembic_config(url, publication=publication), revision)
