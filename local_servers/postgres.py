"""A throwaway PostgreSQL cluster with ``wal_level=logical``, for the demo and the test suite.

It is started from the server binaries installed on this machine (``initdb``/``pg_ctl``) in a
directory of its own, on a free loopback port, and removed by :meth:`LocalPostgres.stop`. PostgreSQL
refuses to run as root, so when the caller is root the cluster runs as the ``postgres`` system user (or
``nobody`` when that user does not exist) and its directory is handed to that user.

Durability is relaxed (``fsync=off``): the cluster is disposable and only ever stopped on purpose, so
the operating system's cache keeps every committed change across the restarts tests perform.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_SERVER_SETTINGS = {
    "wal_level": "logical",
    "max_replication_slots": "64",
    "max_wal_senders": "64",
    "max_connections": "200",
    "listen_addresses": "'127.0.0.1'",
    "fsync": "off",
    "full_page_writes": "off",
    "shared_buffers": "128MB",
    "max_wal_size": "2GB",
    "wal_sender_timeout": "60s",
    "logical_decoding_work_mem": "64MB",
    "log_min_messages": "warning",
}


class PostgresUnavailable(RuntimeError):
    """No throwaway server here: its binaries are missing, or it did not start (the message says why)."""


def find_server_bindir(major: int | None = None) -> Path:
    """Directory holding ``initdb``, ``pg_ctl`` and ``postgres``: of major version ``major``, or newest first.

    Without ``major``: ``CDC_PG_BINDIR`` wins when set; then Debian's ``/usr/lib/postgresql/<major>/bin``;
    then ``PATH``. With ``major``: Debian's directory of that version, else the pinned build set-up
    fetched (:mod:`local_servers.pg_builds`).
    """
    if major is not None:
        debian_dir = Path(f"/usr/lib/postgresql/{major}/bin")
        if (debian_dir / "initdb").exists() and (debian_dir / "pg_ctl").exists():
            return debian_dir
        from local_servers import pg_builds

        fetched = pg_builds.installed_bindir(major)
        if fetched is not None:
            return fetched
        if major not in pg_builds.BUILDS:
            offered = ", ".join(str(m) for m in sorted({*pg_builds.BUILDS, *_debian_majors()}))
            raise PostgresUnavailable(f"no PostgreSQL {major} server binaries here: the versions on offer are {offered}")
        raise PostgresUnavailable(
            f"no PostgreSQL {major} server binaries: the pinned build is not fetched; run scripts/setup "
            "(or `.venv/bin/python -m local_servers.pg_builds`) once, with network access"
        )
    explicit = os.environ.get("CDC_PG_BINDIR")
    candidates: list[Path] = [Path(explicit)] if explicit else []
    candidates += [Path(f"/usr/lib/postgresql/{m}/bin") for m in _debian_majors()]
    on_path = shutil.which("initdb")
    if on_path:
        candidates.append(Path(on_path).resolve().parent)
    for directory in candidates:
        if (directory / "initdb").exists() and (directory / "pg_ctl").exists():
            return directory
    raise PostgresUnavailable(
        "no PostgreSQL server binaries (initdb, pg_ctl) found; install them with "
        "`apt-get install postgresql` or set CDC_PG_BINDIR to their directory"
    )


def _debian_majors() -> list[int]:
    """Major versions Debian's packages installed here, newest first."""
    found = (Path(p).parent.name for p in glob.glob("/usr/lib/postgresql/*/bin"))
    return sorted((int(name) for name in found if name.isdigit()), reverse=True)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _run_as() -> pwd.struct_passwd | None:
    """The unprivileged account to run the server as, or None when not root."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        try:
            return pwd.getpwnam(name)
        except KeyError:
            continue
    raise PostgresUnavailable("running as root and neither a 'postgres' nor a 'nobody' user exists to run PostgreSQL")


@dataclass
class LocalPostgres:
    """One disposable cluster; use as a context manager or call :meth:`start` / :meth:`stop`.

    ``settings`` overrides or adds server settings (``postgresql.conf`` syntax, e.g. ``{"wal_level":
    "replica"}``) on top of the defaults (``_SERVER_SETTINGS``); port and socket directory stay this class's.
    """

    root: Path | None = None
    port: int = 0
    superuser: str = "postgres"
    bindir: Path = field(default_factory=find_server_bindir)
    settings: dict[str, str] = field(default_factory=dict)
    _owned_root: bool = False

    @property
    def data_dir(self) -> Path:
        assert self.root is not None
        return self.root / "data"

    @property
    def log_file(self) -> Path:
        assert self.root is not None
        return self.root / "server.log"

    def url(self, database: str = "postgres", user: str | None = None) -> str:
        """Connection URL over TCP for ``database`` as ``user`` (the superuser by default)."""
        return f"postgresql://{user or self.superuser}@127.0.0.1:{self.port}/{database}"

    def _run(self, *args: str) -> subprocess.CompletedProcess[str]:
        account = _run_as()
        kwargs: dict[str, Any] = {}
        if account is not None:
            kwargs = {"user": account.pw_uid, "group": account.pw_gid, "extra_groups": []}
        result = subprocess.run(
            [str(self.bindir / args[0]), *args[1:]],
            capture_output=True,
            text=True,
            cwd=self.root,
            check=False,
            **kwargs,  # type: ignore[arg-type]
        )
        if result.returncode != 0:
            tail = ""
            if self.log_file.exists():
                tail = " | ".join(self.log_file.read_text(errors="replace").splitlines()[-5:])
            raise PostgresUnavailable(
                f"{args[0]} failed (exit {result.returncode}): {result.stderr.strip() or result.stdout.strip()}"
                f"{' | server log: ' + tail if tail else ''}"
            )
        return result

    def start(self) -> str:
        """Create and start the cluster; returns the superuser URL of database ``postgres``."""
        if self.root is None:
            self.root = Path(tempfile.mkdtemp(prefix="cdc-pg-"))
            self._owned_root = True
        self.root.mkdir(parents=True, exist_ok=True)
        account = _run_as()
        if account is not None:
            os.chown(self.root, account.pw_uid, account.pw_gid)
        if not self.port:
            self.port = free_port()
        if not (self.data_dir / "PG_VERSION").exists():
            self._run(
                "initdb",
                "-D",
                str(self.data_dir),
                "-U",
                self.superuser,
                "--auth=trust",
                "-E",
                "UTF8",
                "--locale=C",
                "--no-sync",
            )
        settings = {**_SERVER_SETTINGS, **self.settings, "port": str(self.port), "unix_socket_directories": f"'{self.root}'"}
        with (self.data_dir / "postgresql.auto.conf").open("a") as conf:
            conf.writelines(f"{key} = {value}\n" for key, value in settings.items())
        self._run("pg_ctl", "-D", str(self.data_dir), "-l", str(self.log_file), "-w", "-t", "60", "start")
        return self.url()

    def restart(self, mode: str = "fast") -> None:
        """Restart the server (``mode`` as pg_ctl's ``-m``: smart, fast or immediate)."""
        self._run("pg_ctl", "-D", str(self.data_dir), "-m", mode, "-w", "-t", "60", "stop")
        self._run("pg_ctl", "-D", str(self.data_dir), "-l", str(self.log_file), "-w", "-t", "60", "start")

    def stop(self, remove: bool = True) -> None:
        """Stop the server at once and, when this object created the directory, delete it."""
        if self.root is None:
            return
        if (self.data_dir / "postmaster.pid").exists():
            try:
                self._run("pg_ctl", "-D", str(self.data_dir), "-m", "immediate", "-w", "stop")
            except PostgresUnavailable:
                pass
        if remove and self._owned_root:
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> LocalPostgres:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
