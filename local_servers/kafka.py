"""A throwaway Apache Kafka broker (KRaft, one combined broker and controller), for tests and the demo.

Set-up fetches the broker's jars once from Maven Central (:func:`fetch`, from ``scripts/setup``): Spark's own
dependency resolver downloads :data:`KAFKA_COORDINATE` with its dependencies into an Ivy cache, and
the jars are copied into :func:`jars_dir`. Spark's resolver leaves out ``scala-library`` (every Spark
carries it), so the copy pyspark ships, of the same Scala 2.13 line, is added. The broker then starts
offline: ``java -cp <jars>/* kafka.Kafka`` in a directory of its own, on two free loopback ports, and
:meth:`LocalKafka.stop` removes it.

Durability is Kafka's own: acknowledged writes are in the broker's page cache and, with one broker,
survive a crash of any client but not of the machine. The broker is disposable.
"""

from __future__ import annotations

import base64
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path

#: The broker version the tests and the demo run (Maven coordinate of its core artifact).
KAFKA_COORDINATE = "org.apache.kafka:kafka_2.13:4.3.1"
#: Logging for the broker: warnings and errors only, to its own file.
_LOG4J2 = """Configuration:
  Appenders:
    File:
      name: file
      fileName: "{log}"
      PatternLayout:
        pattern: "[%d] %p %m (%c)%n"
  Loggers:
    Root:
      level: WARN
      AppenderRef:
        ref: file
"""


class KafkaUnavailable(RuntimeError):
    """The broker's jars are missing or the broker did not start; the message says how to fix it."""


def jars_dir() -> Path:
    """Where the broker's jars live: ``CDC_KAFKA_JARS_DIR``, else ``<virtualenv>/kafka``."""
    explicit = os.environ.get("CDC_KAFKA_JARS_DIR")
    return Path(explicit) if explicit else Path(sys.prefix) / "kafka"


def installed_jars() -> list[Path]:
    """The broker's jar files; empty when set-up has not fetched them (or fetched another version)."""
    directory = jars_dir()
    stamp = directory / "COORDINATE"
    if not stamp.exists() or stamp.read_text().strip() != KAFKA_COORDINATE:
        return []
    return sorted(directory.glob("*.jar"))


def fetch(resolve: Callable[[str], AbstractContextManager[list[Path]]]) -> list[Path]:
    """Resolve and copy the broker's jars unless the current set is already present.

    ``resolve`` gives the jar files of Maven coordinates with their dependencies: Spark's own resolver
    (``derived_views.resolved_jars``, which ``scripts/setup`` passes; this package imports no product
    package)."""
    existing = installed_jars()
    if existing:
        return existing
    import pyspark

    directory = jars_dir()
    with resolve(KAFKA_COORDINATE) as resolved:
        scala = sorted(Path(pyspark.__file__).parent.joinpath("jars").glob("scala-library-2.13.*.jar"))
        if not scala:
            raise KafkaUnavailable("pyspark ships no scala-library 2.13 jar for the broker")
        if directory.exists():
            shutil.rmtree(directory)
        directory.mkdir(parents=True)
        for jar in [*resolved, scala[-1]]:
            shutil.copy2(jar, directory / jar.name)
    (directory / "COORDINATE").write_text(KAFKA_COORDINATE + "\n")
    return installed_jars()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


@dataclass
class LocalKafka:
    """One disposable single-node cluster; use as a context manager or call :meth:`start` / :meth:`stop`.

    ``settings`` adds or overrides broker settings (``server.properties`` syntax) on top of the
    defaults, which make a one-node cluster hold transactions and compact promptly.
    """

    root: Path | None = None
    port: int = 0
    controller_port: int = 0
    settings: dict[str, str] | None = None
    heap: str = "384m"
    _process: subprocess.Popen[bytes] | None = None
    _owned_root: bool = False

    @property
    def bootstrap(self) -> str:
        """``host:port`` of the broker's client listener."""
        return f"127.0.0.1:{self.port}"

    @property
    def log_file(self) -> Path:
        assert self.root is not None
        return self.root / "broker.log"

    def _properties(self, controller_port: int) -> dict[str, str]:
        assert self.root is not None
        return {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@127.0.0.1:{controller_port}",
            "listeners": f"PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{controller_port}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": str(self.root / "data"),
            "num.partitions": "1",
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "3",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "transaction.state.log.num.partitions": "3",
            "group.initial.rebalance.delay.ms": "0",
            "log.cleaner.backoff.ms": "1000",
            **(self.settings or {}),
        }

    def _java(self, *args: str) -> list[str]:
        jars = installed_jars()
        if not jars:
            raise KafkaUnavailable(f"the Kafka broker's jars are not in {jars_dir()}; run ./scripts/setup (it fetches them once)")
        assert self.root is not None
        return [
            "java",
            f"-Xmx{self.heap}",
            "-XX:+UseSerialGC",
            f"-Dlog4j2.configurationFile={self.root / 'log4j2.yaml'}",
            "-cp",
            f"{jars_dir()}/*",
            *args,
        ]

    def start(self, timeout: float = 60.0) -> str:
        """Format (the first time) and start the broker; returns its bootstrap address once it accepts
        connections. After :meth:`kill` it starts again on the same ports with the data it had."""
        if self.root is None:
            self.root = Path(tempfile.mkdtemp(prefix="cdc-kafka-"))
            self._owned_root = True
        self.root.mkdir(parents=True, exist_ok=True)
        self.port = self.port or _free_port()
        self.controller_port = self.controller_port or _free_port()
        config = self.root / "server.properties"
        config.write_text("".join(f"{key}={value}\n" for key, value in self._properties(self.controller_port).items()))
        (self.root / "log4j2.yaml").write_text(_LOG4J2.format(log=self.log_file))
        if not (self.root / "data" / "meta.properties").exists():
            cluster = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
            formatted = subprocess.run(
                # "=": a cluster id may start with "-", which the tool would read as an option
                self._java("kafka.tools.StorageTool", "format", f"--cluster-id={cluster}", f"--config={config}"),
                capture_output=True,
                text=True,
                check=False,
            )
            if formatted.returncode != 0:
                raise KafkaUnavailable(f"formatting the broker's storage failed: {formatted.stderr.strip()[-500:]}")
        with (self.root / "stdout.log").open("ab") as out:
            self._process = subprocess.Popen(
                self._java("kafka.Kafka", str(config)), stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        deadline = time.monotonic() + timeout
        while not _answers(self.port):
            if self._process.poll() is not None or time.monotonic() > deadline:
                tail = self.log_file.read_text(errors="replace")[-1000:] if self.log_file.exists() else ""
                self.stop(remove=False)
                raise KafkaUnavailable(f"the Kafka broker did not start: {tail or 'see ' + str(self.root)}")
            time.sleep(0.2)
        return self.bootstrap

    def kill(self) -> None:
        """Stop the broker abruptly (SIGKILL), keeping its data for :meth:`start` again."""
        if self._process is not None:
            self._process.kill()
            self._process.wait()
            self._process = None

    def stop(self, remove: bool = True) -> None:
        """Stop the broker and, when this object created its directory, delete it."""
        if self._process is not None:
            self._process.terminate()
            try:
                self._process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
            self._process = None
        if remove and self._owned_root and self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> LocalKafka:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
