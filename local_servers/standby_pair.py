"""A primary and a physical standby of one PostgreSQL major version on loopback ports (failover tests, capture
from a standby, its bench).

The standby is made the way operators make one: ``pg_basebackup -R`` (the 18 client build's, which
reads older servers too) from the primary, streaming through a physical slot of its own. On 17 and
later the pair is set up for failover slots as PostgreSQL's own test
``src/test/recovery/t/040_standby_failover_slots_sync.pl`` does: the primary holds logical walsenders
back until the standby has the WAL (``synchronized_standby_slots``), and the standby syncs failover
slots (``sync_replication_slots``, ``hot_standby_feedback``, ``primary_slot_name``, a ``primary_conninfo``
with a database name).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import psycopg

from local_servers import pg_builds
from local_servers.postgres import LocalPostgres, _run_as, find_server_bindir, free_port

#: The standby's physical slot on the primary.
PHYSICAL_SLOT = "standby_1"


@dataclass
class StandbyPair:
    """A primary and its standby (use as a context manager); :meth:`fail_over` stops one and promotes the other."""

    major: int
    root: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="cdc-pair-")))
    primary: LocalPostgres = field(init=False)
    standby: LocalPostgres = field(init=False)

    def __post_init__(self) -> None:
        bindir = find_server_bindir(self.major)
        failover = {"synchronized_standby_slots": f"'{PHYSICAL_SLOT}'"} if self.major >= 17 else {}
        self.primary = LocalPostgres(root=self.root / "primary", bindir=bindir, settings=failover)
        self.standby = LocalPostgres(root=self.root / "standby", bindir=bindir)

    @property
    def failover_slots(self) -> bool:
        """Whether the pair syncs failover slots (PostgreSQL 17 and later)."""
        return self.major >= 17

    def url(self, database: str = "postgres") -> str:
        """A multi-host URL that reaches whichever of the two is primary."""
        return (
            f"postgresql://postgres@127.0.0.1:{self.primary.port},127.0.0.1:{self.standby.port}/{database}"
            "?target_session_attrs=primary&connect_timeout=3"
        )

    def start(self, database: str) -> None:
        """Start the primary, create ``database`` on it, and a standby of it that streams and replays."""
        self.root.mkdir(parents=True, exist_ok=True)
        account = _run_as()
        if account is not None:
            os.chown(self.root, account.pw_uid, account.pw_gid)
        self.primary.start()
        with psycopg.connect(self.primary.url(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{database}"')
            conn.execute("SELECT pg_create_physical_replication_slot(%s)", (PHYSICAL_SLOT,))
        self.standby.port = free_port()
        assert self.standby.root is not None
        self.standby.root.mkdir()
        if account is not None:
            os.chown(self.standby.root, account.pw_uid, account.pw_gid)
        clients = pg_builds.installed_client_bindir(18)
        assert clients is not None, "the PostgreSQL 18 client programs are not fetched: run scripts/setup"
        conninfo = f"host=127.0.0.1 port={self.primary.port} user=postgres dbname={database}"
        subprocess.run(
            [str(clients / "pg_basebackup"), "-d", conninfo, "-D", str(self.standby.data_dir), "-R", "-X", "stream",
             "-S", PHYSICAL_SLOT, "-c", "fast", "--no-sync"],
            check=True, capture_output=True, text=True, cwd=self.root,
            user=account.pw_uid if account else None, group=account.pw_gid if account else None,
            extra_groups=[] if account else None,
        )  # fmt: skip
        standby_settings = {
            # the 18 client writes options older servers do not know (sslnegotiation): the conninfo is ours
            "primary_conninfo": f"'{conninfo}'",
            "primary_slot_name": f"'{PHYSICAL_SLOT}'",
            "hot_standby_feedback": "on",
        }
        if self.failover_slots:
            # the primary's setting, copied by the backup, names a slot the promoted standby will not have
            standby_settings["synchronized_standby_slots"] = "''"
        if self.failover_slots:
            standby_settings["sync_replication_slots"] = "on"
        # the base backup copied the primary's settings (port, socket directory); the standby's own go after them
        self.standby.settings = standby_settings
        self.standby.start()
        deadline = time.monotonic() + 60
        with psycopg.connect(self.primary.url(), autocommit=True) as conn:
            while conn.execute("SELECT 1 FROM pg_stat_replication WHERE state = 'streaming'").fetchone() is None:
                if time.monotonic() > deadline:
                    raise RuntimeError("the standby does not stream from the primary after 60 s")
                time.sleep(0.05)

    def fail_over(self) -> None:
        """Stop the primary as a crash does (``pg_ctl stop -m immediate``) and promote the standby."""
        if (self.primary.data_dir / "postmaster.pid").exists():
            self.primary._run("pg_ctl", "-D", str(self.primary.data_dir), "-m", "immediate", "-w", "stop")
        self.standby._run("pg_ctl", "-D", str(self.standby.data_dir), "-w", "-t", "60", "promote")

    def stop(self) -> None:
        self.primary.stop(remove=False)
        self.standby.stop(remove=False)
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> StandbyPair:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
