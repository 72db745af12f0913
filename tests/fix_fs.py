"""Real filesystem conditions for tests: a size-limited filesystem, and commands run without root's privileges.

Both need root (``mount``, changing user); the fixtures skip with the reason when the machine refuses.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

#: The user the unprivileged commands run as (PostgreSQL's, which every test machine here has).
UNPRIVILEGED_USER = "postgres"


@dataclass
class SmallFilesystem:
    """A tmpfs of a given size mounted at ``path``; :meth:`resize` stands for freeing or adding disk space."""

    path: Path

    def resize(self, size: str) -> None:
        subprocess.run(["mount", "-o", f"remount,size={size}", str(self.path)], check=True, capture_output=True)

    def fill(self, leave: int = 0) -> Path:
        """Write a file until the filesystem is full, then give back ``leave`` bytes; remove the file to
        free the space again."""
        filler = self.path / "filler"
        with open(filler, "wb") as out:
            try:
                while True:
                    out.write(b"\0" * (64 << 10))
                    out.flush()
            except OSError:
                pass
        size = filler.stat().st_size
        os.truncate(filler, max(0, size - leave))
        return filler


@pytest.fixture
def small_filesystem(tmp_path: Path) -> Iterator[SmallFilesystem]:
    """An empty 2 MiB tmpfs, unmounted after the test; skipped where mounting is not permitted."""
    path = tmp_path / "small"
    path.mkdir()
    if shutil.which("mount") is None:
        pytest.skip("no mount command: a size-limited filesystem cannot be made")
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m,mode=0700", "tmpfs", str(path)], capture_output=True, text=True
    )
    if result.returncode != 0:
        pytest.skip(
            f"mounting a tmpfs is not permitted here ({result.stderr.strip()}): run the tests as root "
            "with CAP_SYS_ADMIN to test a full disk"
        )
    try:
        yield SmallFilesystem(path)
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False, capture_output=True)


@dataclass(frozen=True)
class Unprivileged:
    """Runs commands as :data:`UNPRIVILEGED_USER`, for whom permission bits count (root ignores them)."""

    user: str
    uid: int
    gid: int

    def command(self, args: list[str]) -> list[str]:
        """``args`` run as the user. It keeps one capability, reading and searching any directory, only
        because the interpreter lives under root's private home here; writing still needs the permission
        bits, which is what the tests exercise."""
        return [
            "setpriv",
            "--reuid",
            str(self.uid),
            "--regid",
            str(self.gid),
            "--clear-groups",
            "--inh-caps",
            "+dac_read_search",
            "--ambient-caps",
            "+dac_read_search",
            "--",
            *args,
        ]

    def own(self, path: Path) -> None:
        """Give ``path`` and everything below it to the user."""
        for root, dirs, files in os.walk(path):
            for name in [*dirs, *files]:
                os.chown(os.path.join(root, name), self.uid, self.gid)
        os.chown(path, self.uid, self.gid)


@pytest.fixture(scope="session")
def unprivileged() -> Unprivileged:
    """The unprivileged user; skipped when this process cannot switch users."""
    import pwd

    if os.geteuid() != 0:
        pytest.skip("switching to an unprivileged user needs root")
    if shutil.which("setpriv") is None:
        pytest.skip("no setpriv (util-linux): cannot run a command as an unprivileged user")
    try:
        entry = pwd.getpwnam(UNPRIVILEGED_USER)
    except KeyError:
        pytest.skip(f"no user {UNPRIVILEGED_USER!r} to run commands as")
    runner = Unprivileged(UNPRIVILEGED_USER, entry.pw_uid, entry.pw_gid)
    probe = subprocess.run(runner.command(["id", "-u"]), capture_output=True, text=True)
    if probe.returncode != 0 or probe.stdout.strip() != str(entry.pw_uid):
        pytest.skip(f"cannot run a command as {UNPRIVILEGED_USER} here: {probe.stderr.strip()}")
    return runner
