"""One settings class for the whole pipeline, read from ``CDC_*`` environment variables and ``.env``.

Secrets (the database password, the mask and request keys, Kafka's passwords) may instead be read from
files (:mod:`cdc.config.secret_values`). A secret never reaches a log, an error or a screen: the keys
are :class:`~pydantic.SecretStr`, and the database password joins the connection URL as its ``password``
parameter, which :func:`cdc.config.redact.redact_url` hides wherever the URL is shown. What each setting
accepts, shown when a value is rejected, is :data:`cdc.config.setting_values.ACCEPTS`.
"""

from __future__ import annotations

import re
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import Field, SecretStr, ValidationError, ValidationInfo, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from cdc.config.redact import redact_url
from cdc.config.secret_values import SECRET_FILES, misread_by_libpq, read_secret_file, with_password
from cdc.config.setting_names import warn_of_unknown_names
from cdc.config.setting_values import ACCEPTS
from cdc.errors import ConfigError
from event_format import fold_after
from log_store import LogConfig
from log_store.topic_names import topic_name

if TYPE_CHECKING:
    from derived_views import MaintenancePolicy
    from log_store.kafka.log import KafkaSettings


_IDENTIFIER = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
_TOPIC_PREFIX = re.compile(r"^[A-Za-z0-9_-]+$")
_TABLE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_$]*\.[A-Za-z_][A-Za-z0-9_$]*$")


#: librdkafka's names of the security settings that ``CDC_KAFKA_*`` settings give.
_KAFKA_CLIENT_NAMES = {
    "kafka_security_protocol": "security.protocol",
    "kafka_sasl_mechanism": "sasl.mechanism",
    "kafka_sasl_username": "sasl.username",
    "kafka_sasl_password": "sasl.password",
    "kafka_ssl_ca_location": "ssl.ca.location",
    "kafka_ssl_certificate_location": "ssl.certificate.location",
    "kafka_ssl_key_location": "ssl.key.location",
    "kafka_ssl_key_password": "ssl.key.password",
}
_KAFKA_URL = re.compile(
    r"^kafka://([A-Za-z0-9.-]+|\[[0-9A-Fa-f:]+\]):[0-9]{1,5}(,([A-Za-z0-9.-]+|\[[0-9A-Fa-f:]+\]):[0-9]{1,5})*$"
)


class Settings(BaseSettings):
    """Every setting of the pipeline; environment variables are ``CDC_<NAME>`` (upper case)."""

    model_config = SettingsConfigDict(env_prefix="CDC_", env_file=".env", env_file_encoding="utf-8", extra="ignore")

    database_url: str = Field(
        default="postgresql://postgres@localhost:5432/postgres",
        description="Source PostgreSQL (the system of record).",
    )
    data_dir: Path = Field(default=Path("./data"), description="Holds log/ and the Delta tables.")
    tables: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="schema.table include list; empty = whole publication."
    )
    slot: str = Field(default="cdc_slot", description="Logical replication slot name.")
    publication: str = Field(default="cdc_publication", description="Publication name.")
    slot_failover: str = Field(
        default="auto",
        description="Create the slot with FAILOVER true (PostgreSQL 17+): auto, true or false (cdc.setup.failover).",
    )
    standby_url: str = Field(default="", description="The physical standby, for setup's failover checks and lag.")
    primary_url: str = Field(
        default="", description="The primary, when CDC_DATABASE_URL names a hot standby to capture from (cdc.capture.standby)."
    )
    partitions: int = Field(default=3, ge=1, le=1024, description="Partitions per topic.")
    topic_prefix: str = Field(default="cdc", description="Topic name prefix.")
    outbox_prefix: str = Field(
        default="outbox",
        description="Messages prefixed <topic_prefix>.<outbox_prefix>.<topic> are outbox events (cdc.capture.outbox).",
    )
    outbox_key_field: str = Field(default="", description="The payload field whose value keys an outbox event.")
    segment_bytes: int = Field(default=64 << 20, ge=1024, le=1 << 30)
    segment_ms: int = Field(default=7 * 24 * 3600 * 1000, ge=1000)
    delete_retention_ms: int = Field(default=24 * 3600 * 1000, ge=0)
    retention_ms: int = Field(default=-1, ge=-1)
    retention_bytes: int = Field(default=-1, ge=-1)
    log_compact_interval_s: float = Field(
        default=3600.0, ge=0, description="Seconds between compactions of the embedded log by `cdc capture` (0: never)."
    )
    views_file: Path = Field(default=Path("views.toml"), description="The views file (derived_views.definitions).")
    metrics_port: int = Field(default=0, ge=0, le=65535)
    log_format: str = Field(default="kv")
    recreate_lost_slot: bool = Field(
        default=False,
        description="Capture makes a lost (dropped or invalidated) slot again and reads every table again, instead of stopping.",
    )
    snapshot_concurrency: int = Field(default=2, ge=1, le=64, description="Tables read at once beside the stream.")
    snapshot_chunk_rows: int = Field(
        default=20_000, ge=100, le=1_000_000, description="Rows per chunk (and group) of a table read beside the stream."
    )
    snapshot_sessions: int = Field(
        default=2, ge=1, le=8, description="Sessions that read a snapshot's chunks (key ranges) at once."
    )
    snapshot_rows_per_second: int = Field(
        default=0, ge=0, description="A ceiling on the rows per second reads take from the source (0: none)."
    )
    deletion_vectors: bool = Field(
        default=False, description="New view tables use Delta deletion vectors (faster MERGEs; fewer readers)."
    )
    change_data_feed: bool = Field(
        default=False, description="New view tables record Delta's Change Data Feed (readChangeFeed jobs read it)."
    )
    maintenance: bool = Field(default=True, description="`cdc sync --continuous` compacts and vacuums the view tables.")
    maintenance_interval_s: float = Field(default=300.0, gt=0, description="Seconds between looks at the tables' health.")
    maintenance_small_files: int = Field(default=32, ge=2, description="Small files a view table holds before compaction.")
    maintenance_small_file_bytes: int = Field(default=16 << 20, ge=1024, description="A file under this size is small.")
    maintenance_versions: int = Field(default=200, ge=1, description="Commits since the last compaction before the next.")
    vacuum_retention_hours: float = Field(
        default=168.0, ge=1, description="Vacuum keeps the files of every version younger than this (Delta's 7 days)."
    )
    log: str = Field(default="", description="Empty: the embedded log; kafka://host:port,...: the log in Kafka.")
    kafka_security_protocol: str = Field(default="")
    kafka_sasl_mechanism: str = Field(default="")
    kafka_sasl_username: str = Field(default="")
    kafka_sasl_password: SecretStr = Field(default=SecretStr(""))
    kafka_ssl_ca_location: str = Field(default="")
    kafka_ssl_certificate_location: str = Field(default="")
    kafka_ssl_key_location: str = Field(default="")
    kafka_ssl_key_password: SecretStr = Field(default=SecretStr(""))
    kafka_timeout_ms: int = Field(default=10_000, ge=100, le=600_000)
    mask_key: SecretStr = Field(
        default=SecretStr(""),
        description="The key of hash masks (event_format.masks): never written to the log; at least 16 bytes.",
    )
    request_key: SecretStr = Field(
        default=SecretStr(""),
        description=(
            "The key that signs `cdc snapshot --where` requests (cdc.capture.reads.snapshot_requests); at least 16 bytes."
        ),
    )
    database_password: SecretStr = Field(
        default=SecretStr(""),
        description="The source role's password, kept out of CDC_DATABASE_URL (joins it as its password parameter).",
    )
    database_password_file: Path | None = Field(default=None, description="A file holding CDC_DATABASE_PASSWORD.")
    mask_key_file: Path | None = Field(default=None, description="A file holding CDC_MASK_KEY.")
    request_key_file: Path | None = Field(default=None, description="A file holding CDC_REQUEST_KEY.")
    kafka_sasl_password_file: Path | None = Field(default=None, description="A file holding CDC_KAFKA_SASL_PASSWORD.")
    kafka_ssl_key_password_file: Path | None = Field(default=None, description="A file holding CDC_KAFKA_SSL_KEY_PASSWORD.")

    @model_validator(mode="before")
    @classmethod
    def _read_secret_files(cls, data: Any) -> Any:
        """Each ``CDC_<NAME>_FILE`` read into ``<name>``, which then passes its own checks; a secret given
        both ways, or a file that cannot be read, is one :class:`ConfigError` that never quotes the file."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        for name in SECRET_FILES:
            path = data.get(f"{name}_file")
            if not path:
                continue
            given = data.get(name)
            if isinstance(given, SecretStr):
                given = given.get_secret_value()
            if given:
                raise ConfigError(f"CDC_{name.upper()} and CDC_{name.upper()}_FILE are both set: keep one")
            data[name] = read_secret_file(Path(str(path)), f"CDC_{name.upper()}_FILE")
        return data

    @model_validator(mode="after")
    def _join_database_password(self) -> Settings:
        """The database password joins ``database_url`` as its ``password`` parameter, so that every
        connection (catalog, snapshot, replication) and every process given the URL uses it; and
        ``standby_url`` and ``primary_url`` too when they hold none (a physical standby has the primary's roles)."""
        password = self.database_password.get_secret_value()
        if not password:
            return self
        from psycopg.conninfo import conninfo_to_dict

        if conninfo_to_dict(self.database_url).get("password"):
            raise ConfigError("CDC_DATABASE_URL holds a password and CDC_DATABASE_PASSWORD(_FILE) gives one: keep one")
        self.database_url = with_password(self.database_url, password)
        if self.standby_url and not conninfo_to_dict(self.standby_url).get("password"):
            self.standby_url = with_password(self.standby_url, password)
        if self.primary_url and not conninfo_to_dict(self.primary_url).get("password"):
            self.primary_url = with_password(self.primary_url, password)
        return self

    @field_validator("tables", mode="before")
    @classmethod
    def _split_tables(cls, value: object) -> object:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @field_validator("tables")
    @classmethod
    def _check_tables(cls, value: list[str]) -> list[str]:
        for name in value:
            if not _TABLE_NAME.match(name):
                raise ValueError(f"{name!r} is not schema.table")
        return value

    @field_validator("slot", "publication")
    @classmethod
    def _check_identifier(cls, value: str) -> str:
        if not _IDENTIFIER.match(value):
            raise ValueError(f"{value!r} is not a valid name")
        return value

    @field_validator("topic_prefix")
    @classmethod
    def _check_prefix(cls, value: str) -> str:
        if not _TOPIC_PREFIX.match(value):
            raise ValueError(f"{value!r} has characters a topic name cannot hold")
        if len(value) > 100:
            # with at most 100, every plain table's topic keeps its length and the internal topics fit Kafka's 249
            raise ValueError(f"it is {len(value)} characters long")
        return value

    @field_validator("outbox_prefix")
    @classmethod
    def _check_outbox_prefix(cls, value: str) -> str:
        if not _TOPIC_PREFIX.match(value):
            raise ValueError(f"{value!r} has characters a topic name cannot hold")
        if len(value) > 40:
            raise ValueError(f"it is {len(value)} characters long")
        return value

    @field_validator("outbox_key_field")
    @classmethod
    def _check_key_field(cls, value: str) -> str:
        if len(value) > 200:
            raise ValueError(f"it is {len(value)} characters long")
        return value

    @field_validator("mask_key", "request_key")
    @classmethod
    def _long_enough(cls, value: SecretStr) -> SecretStr:
        if value.get_secret_value() and len(value.get_secret_value().encode()) < 16:
            raise ValueError("too short")
        return value

    @property
    def mask_key_bytes(self) -> bytes | None:
        """The hash masks' key (``None`` when ``CDC_MASK_KEY`` is not set)."""
        return self.mask_key.get_secret_value().encode() or None

    @property
    def request_key_bytes(self) -> bytes | None:
        """The key of signed requests (``None`` when ``CDC_REQUEST_KEY`` is not set)."""
        return self.request_key.get_secret_value().encode() or None

    @field_validator("database_url", "standby_url", "primary_url")
    @classmethod
    def _check_url(cls, value: str, info: ValidationInfo) -> str:
        if not value and info.field_name in ("standby_url", "primary_url"):
            return value  # no standby, or capture from the primary
        if not value.startswith(("postgresql://", "postgres://")):
            raise ValueError("it does not start with postgresql://")
        if misread_by_libpq(value):
            # never quote the value, nor libpq's message about it: either may hold part of the password
            raise ValueError(
                "its user name or password holds a character that must be percent-encoded, so PostgreSQL would "
                "read another password (and show part of it in its errors); percent-encode the password "
                '(@ as %40, / as %2F, % as %25, a space as %20; python3 -c "import urllib.parse, getpass; '
                "print(urllib.parse.quote(getpass.getpass(), safe=''))\" prints it encoded)"
            )
        return value

    @field_validator("slot_failover")
    @classmethod
    def _check_slot_failover(cls, value: str) -> str:
        if value.lower() not in ("auto", "true", "false"):
            raise ValueError(f"{value!r} is none of auto, true and false")
        return value.lower()

    @field_validator("log_format")
    @classmethod
    def _check_log_format(cls, value: str) -> str:
        if value not in ("json", "kv"):
            raise ValueError(f"{value!r} is neither json nor kv")
        return value

    @field_validator("log")
    @classmethod
    def _check_log(cls, value: str) -> str:
        if value and not _KAFKA_URL.match(value):
            raise ValueError(f"{value!r} is not kafka://host:port with more brokers after commas")
        return value

    @field_validator("kafka_security_protocol")
    @classmethod
    def _check_security_protocol(cls, value: str) -> str:
        if value and value.lower() not in ("plaintext", "ssl", "sasl_plaintext", "sasl_ssl"):
            raise ValueError(f"{value!r} is not a Kafka security protocol")
        return value.lower()

    @field_validator("kafka_sasl_mechanism")
    @classmethod
    def _check_sasl_mechanism(cls, value: str) -> str:
        if value and value.upper() not in ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"):
            raise ValueError(f"{value!r} is not a SASL mechanism this pipeline's Kafka clients take")
        return value.upper()

    @field_validator("kafka_ssl_ca_location", "kafka_ssl_certificate_location", "kafka_ssl_key_location")
    @classmethod
    def _check_pem_file(cls, value: str) -> str:
        if value and not Path(value).is_file():
            raise ValueError(f"{value!r} is not a file")
        return value

    @property
    def uses_kafka(self) -> bool:
        """Whether the log lives in Kafka (``CDC_LOG=kafka://...``) rather than under ``CDC_DATA_DIR``."""
        return bool(self.log)

    def kafka_client(self) -> dict[str, str]:
        """The librdkafka properties every Kafka client of the log gets: brokers, security, SASL and TLS."""
        client = {"bootstrap.servers": self.log.removeprefix("kafka://")}
        for name, prop in _KAFKA_CLIENT_NAMES.items():
            value = getattr(self, name)
            text = value.get_secret_value() if isinstance(value, SecretStr) else value
            if text:
                client[prop] = text
        return client

    def kafka_settings(self) -> KafkaSettings:
        """Where and how :class:`~log_store.kafka.log.KafkaLog` keeps this pipeline's topics."""
        from log_store.kafka.log import KafkaSettings

        client = self.kafka_client()
        return KafkaSettings(
            bootstrap=client.pop("bootstrap.servers"),
            prefix=self.topic_prefix,
            client=client,
            delete_retention_ms=self.delete_retention_ms,
            retention_ms=self.retention_ms,
            retention_bytes=self.retention_bytes,
            timeout_s=self.kafka_timeout_ms / 1000,
        )

    def maintenance_policy(self) -> MaintenancePolicy:
        """When the view tables are compacted and which old files vacuum removes
        (:mod:`derived_views.engine.maintenance`)."""
        from derived_views import MaintenancePolicy

        return MaintenancePolicy(
            small_files=self.maintenance_small_files,
            small_file_bytes=self.maintenance_small_file_bytes,
            versions=self.maintenance_versions,
            retention_hours=self.vacuum_retention_hours,
            interval_s=self.maintenance_interval_s,
        )

    def log_location(self) -> str:
        """Where the log is, for messages: its directory, or ``kafka://brokers``."""
        return self.log or str(self.log_dir)

    @cached_property
    def log_dir(self) -> Path:
        """Where the embedded log keeps its topics."""
        return self.data_dir / "log"

    @cached_property
    def views_dir(self) -> Path:
        """Root of the Delta tables (``warehouse/``, ``search/``, ``cache/`` below it)."""
        return self.data_dir

    def log_config(self) -> LogConfig:
        """The embedded log's tunables these settings describe."""
        return LogConfig(
            segment_bytes=self.segment_bytes,
            segment_ms=self.segment_ms,
            delete_retention_ms=self.delete_retention_ms,
            retention_ms=self.retention_ms,
            retention_bytes=self.retention_bytes,
            fold=fold_after,
        )

    def topic_for(self, schema: str, table: str) -> str:
        """Topic name of one source table: ``<prefix>.<schema>.<table>`` for plain names, escaped otherwise.

        Legal for Kafka, different for every (schema, table) and stable: see :mod:`log_store.topic_names`.
        """
        return topic_name(self.topic_prefix, schema, table)

    @property
    def outbox_message_prefix(self) -> str:
        """How the prefix of an outbox message begins: ``<topic_prefix>.<outbox_prefix>.`` (then its topic's own name)."""
        return f"{self.topic_prefix}.{self.outbox_prefix}."

    def safe_database_url(self) -> str:
        """The source URL with any password replaced, for logs and screens."""
        return redact_url(self.database_url)


def load_settings(**overrides: object) -> Settings:
    """Read the settings, turning a rejected value into one :class:`ConfigError` line.

    The message names the environment variable, the value's problem and what it accepts, so that the
    CLI can print it without a traceback. A ``CDC_*`` variable or ``.env`` entry that names no setting is
    warned of first (:mod:`cdc.config.setting_names`).
    """
    env_file = Settings.model_config.get("env_file")
    warn_of_unknown_names(Settings.model_fields, Path(str(env_file)) if env_file else None)
    try:
        return Settings(**overrides)  # type: ignore[arg-type]
    except ValidationError as exc:
        first = exc.errors()[0]
        field = str(first["loc"][0]) if first["loc"] else "?"
        reason = str(first["msg"]).removeprefix("Value error, ")
        accepts = ACCEPTS.get(field, "see the README's configuration table")
        raise ConfigError(f"setting CDC_{field.upper()} is invalid: {reason}; it accepts {accepts}") from None
