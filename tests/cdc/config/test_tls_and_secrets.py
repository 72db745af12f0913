"""TLS with ``sslmode=verify-full`` against a PostgreSQL server whose certificate a CA made here signed,
for the catalog's and the replication connection; a wrong CA, host name or password is one clear line;
secrets read from files reach no log line, error or ``cdc lag`` output.

One server serves the module: TLS only (``hostssl``), the capture role authenticated by password
(SCRAM), the superuser trusted over TLS for the fixture's own set-up.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import psycopg
import pytest

from cdc.config.settings import load_settings
from cdc.errors import ConfigError
from local_servers.postgres import LocalPostgres, _run_as, find_server_bindir
from tests.cdc.helpers import wait_for
from tests.fix_pg import chosen_pg_version
from tests.fix_tls import TlsFiles, make_tls_files

CDC = Path(sys.executable).with_name("cdc")
ROLE = "cdc_tls"
PASSWORD = "p@ss w/rd%-tls"  # characters a URL would need encoded: the file gives it as written
MASK_KEY = "mask-key-from-a-file-0123456789"
REQUEST_KEY = "request-key-from-a-file-98765"
SECRETS = (PASSWORD, MASK_KEY, REQUEST_KEY, "p%40ss")


@dataclass(frozen=True)
class TlsServer:
    server: LocalPostgres
    tls: TlsFiles
    stranger: TlsFiles
    secrets: Path

    def url(self, host: str = "localhost", ca: Path | None = None, extra: str = "") -> str:
        return f"postgresql://{ROLE}@{host}:{self.server.port}/shop?sslmode=verify-full&sslrootcert={ca or self.tls.ca}{extra}"

    def admin(self) -> psycopg.Connection[tuple[object, ...]]:
        return psycopg.connect(self.server.url("shop") + "?sslmode=require", autocommit=True)


@pytest.fixture(scope="module")
def tls_server() -> Iterator[TlsServer]:
    from cdc.setup import migrate

    root = Path(tempfile.mkdtemp(prefix="cdc-pg-tls-"))
    tls = make_tls_files(root / "tls")
    stranger = make_tls_files(root / "stranger", ca_name="stranger-ca")  # a CA that did not sign the server
    account = _run_as()
    if account is not None:  # the server runs as this account and must read its key, and nobody else
        for path in (root, root / "tls", tls.server_certificate, tls.server_key):
            os.chown(path, account.pw_uid, account.pw_gid)
    server = LocalPostgres(
        root=root,
        bindir=find_server_bindir(chosen_pg_version()),
        settings={"ssl": "on", "ssl_cert_file": f"'{tls.server_certificate}'", "ssl_key_file": f"'{tls.server_key}'"},
    )
    server.start()
    try:
        (server.data_dir / "pg_hba.conf").write_text(
            "local all all trust\n"
            "hostssl all postgres 127.0.0.1/32 trust\n"
            "hostssl all all 127.0.0.1/32 scram-sha-256\n"
            "hostssl replication all 127.0.0.1/32 scram-sha-256\n"
        )
        with psycopg.connect(server.url() + "?sslmode=require", autocommit=True) as admin:
            admin.execute("SELECT pg_reload_conf()")
            admin.execute("CREATE DATABASE shop")
            admin.execute(f"CREATE ROLE {ROLE} LOGIN SUPERUSER REPLICATION PASSWORD '{PASSWORD}'")
        migrate.upgrade(server.url("shop") + "?sslmode=require")
        secrets = root / "secrets"
        secrets.mkdir()
        for name, value in (("db_password", PASSWORD), ("mask_key", MASK_KEY), ("request_key", REQUEST_KEY)):
            (secrets / name).write_text(value + "\n")  # as `echo` writes it
        yield TlsServer(server, tls, stranger, secrets)
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


def _env(tls_server: TlsServer, data_dir: Path, url: str, password_file: Path | None = None) -> dict[str, str]:
    return {
        **os.environ,
        "CDC_DATABASE_URL": url,
        "CDC_DATABASE_PASSWORD_FILE": str(password_file or tls_server.secrets / "db_password"),
        "CDC_MASK_KEY_FILE": str(tls_server.secrets / "mask_key"),
        "CDC_REQUEST_KEY_FILE": str(tls_server.secrets / "request_key"),
        "CDC_DATA_DIR": str(data_dir),
        "CDC_SLOT": "tls_slot",
        "CDC_LOG_FORMAT": "json",
    }


def _cdc(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(CDC), *args], env=env, capture_output=True, text=True, timeout=300)


def _no_secret(*outputs: str) -> None:
    for output in outputs:
        for secret in SECRETS:
            assert secret not in output


def _replication_over_tls(tls_server: TlsServer) -> bool:
    with tls_server.admin() as admin:
        row = admin.execute(
            "SELECT s.ssl, r.usename FROM pg_replication_slots p JOIN pg_stat_ssl s ON s.pid = p.active_pid "
            "JOIN pg_stat_replication r ON r.pid = p.active_pid WHERE p.slot_name = 'tls_slot'"
        ).fetchone()
    return row is not None and row == (True, ROLE)


def test_verify_full_for_every_connection_with_secrets_from_files(tls_server: TlsServer, tmp_path: Path) -> None:
    env = _env(tls_server, tmp_path / "data", tls_server.url())
    setup = _cdc(env, "setup")
    assert setup.returncode == 0, setup.stderr
    capture = subprocess.Popen([str(CDC), "capture"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # the replication connection streams over TLS, as the capture role, authenticated by the file's password
        wait_for(lambda: _replication_over_tls(tls_server) or capture.poll() is not None, what="capture streaming")
        assert capture.poll() is None
        with tls_server.admin() as admin:
            admin.execute("INSERT INTO categories (name) VALUES ('over tls')")
            # every session of the capture role (catalog, snapshot and replication alike) is encrypted
            sessions = admin.execute(
                "SELECT bool_and(s.ssl), count(*) FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid) WHERE a.usename = %s",
                (ROLE,),
            ).fetchone()
        assert sessions is not None and sessions[0] is True and sessions[1] >= 1
    finally:
        capture.send_signal(signal.SIGTERM)
        stdout, stderr = capture.communicate(timeout=60)
    assert capture.returncode == 0, stderr
    lag = _cdc(env, "lag", "--json")
    assert lag.returncode == 0, lag.stderr
    assert '"slot": "tls_slot"' in lag.stdout
    _no_secret(setup.stdout, setup.stderr, stdout, stderr, lag.stdout, lag.stderr)


#: each command opens its first connection elsewhere: setup's checks, capture's catalog, lag's own
COMMANDS = (("setup", "--check-only"), ("capture", "--once"), ("lag",))


@pytest.mark.parametrize(
    ("case", "expected", "commands"),
    [
        ("wrong CA", ["certificate verify failed", "not signed by the CA the URL's sslrootcert names"], COMMANDS),
        ("wrong host name", ['does not match host name "db.example"', "sslmode=verify-ca"], COMMANDS[1:]),
        ("wrong password", ["password authentication failed", ROLE], COMMANDS[2:]),
    ],
)
def test_a_wrong_ca_host_name_or_password_is_one_clear_line(
    tls_server: TlsServer, tmp_path: Path, case: str, expected: list[str], commands: tuple[tuple[str, ...], ...]
) -> None:
    url, password_file = tls_server.url(), None
    if case == "wrong CA":
        url = tls_server.url(ca=tls_server.stranger.ca)
    elif case == "wrong host name":
        url = tls_server.url(host="db.example", extra="&hostaddr=127.0.0.1")  # the server, by a name its certificate lacks
    else:
        password_file = tmp_path / "wrong"
        password_file.write_text(PASSWORD + "-not\n")
    env = _env(tls_server, tmp_path / "data", url, password_file)
    for args in commands:
        result = _cdc(env, *args)
        lines = result.stderr.strip().splitlines()
        assert result.returncode != 0 and result.stdout == "", (args, result.stderr)
        assert len(lines) == 1 and lines[0].startswith("error: "), (args, result.stderr)
        assert all(part in lines[0] for part in expected), (args, lines[0])
        _no_secret(result.stderr)


def test_secret_files_give_the_secrets_and_their_errors_never_show_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in (("pw", PASSWORD), ("mask", MASK_KEY), ("request", REQUEST_KEY), ("short", "tiny-key")):
        (tmp_path / name).write_text(value + "\r\n")
    monkeypatch.delenv("CDC_DATABASE_PASSWORD", raising=False)
    settings = load_settings(
        database_url="postgresql://app@db/shop?sslmode=verify-full",
        database_password_file=tmp_path / "pw",
        mask_key_file=tmp_path / "mask",
        request_key_file=tmp_path / "request",
        kafka_sasl_password_file=tmp_path / "pw",
    )
    assert settings.mask_key_bytes == MASK_KEY.encode() and settings.request_key_bytes == REQUEST_KEY.encode()
    assert settings.kafka_client()["sasl.password"] == PASSWORD
    from psycopg.conninfo import conninfo_to_dict

    assert conninfo_to_dict(settings.database_url)["password"] == PASSWORD
    standby = load_settings(
        database_url="postgresql://app@db/shop",
        standby_url="postgresql://app@standby/shop",
        database_password_file=tmp_path / "pw",
    )
    assert conninfo_to_dict(standby.standby_url)["password"] == PASSWORD  # a physical standby has the primary's roles
    assert settings.safe_database_url() == "postgresql://app@db/shop?sslmode=verify-full&password=***"
    refusals = [
        {"mask_key_file": tmp_path / "short"},  # too short, read from a file
        {"mask_key_file": tmp_path / "missing"},
        {"mask_key_file": tmp_path / "mask", "mask_key": MASK_KEY},  # given both ways
        {"database_url": f"postgresql://app:{quote(PASSWORD, safe='')}@db/shop", "database_password_file": tmp_path / "pw"},
    ]
    for overrides in refusals:
        with pytest.raises(ConfigError) as info:
            load_settings(**overrides)
        message = str(info.value)
        assert "CDC_" in message
        _no_secret(message)
        assert "tiny-key" not in message
