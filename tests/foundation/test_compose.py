"""compose.yaml wires the services correctly (no Docker engine here, so the file is checked as data)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
import yaml

from cdc.cli import cli
from cdc.commands import register

ROOT = Path(__file__).resolve().parents[2]


def _compose() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "compose.yaml").read_text())


def _cli_commands() -> set[str]:
    register(cli)
    return set(cli.commands)


def test_postgres_runs_with_logical_wal() -> None:
    command = _compose()["services"]["postgres"]["command"]
    assert "wal_level=logical" in command


def test_capture_and_sync_share_the_data_volume() -> None:
    services = _compose()["services"]
    mounts = {}
    for name in ("capture", "sync"):
        environment = services[name]["environment"]
        data_dir = environment["CDC_DATA_DIR"]
        volume = next(v.split(":")[0] for v in services[name]["volumes"] if v.split(":")[1] == data_dir)
        mounts[name] = volume
    assert mounts["capture"] == mounts["sync"]
    assert mounts["capture"] in _compose()["volumes"]


def test_service_commands_exist_in_the_cli() -> None:
    commands = _cli_commands()
    for name, service in _compose()["services"].items():
        if "build" not in service:
            continue
        args = service["command"]
        assert args[0] in commands, f"service {name} runs unknown command {args[0]!r}"
        command = cli.commands[args[0]]
        ctx = click.Context(command, info_name=args[0])
        command.parse_args(ctx, list(args[1:]))  # raises on an unknown option


def test_services_point_at_the_compose_database() -> None:
    services = _compose()["services"]
    for name in ("migrate", "capture", "sync"):
        url = services[name]["environment"]["CDC_DATABASE_URL"]
        assert "@postgres:5432/" in url
    assert services["capture"]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"


def test_the_kafka_profile_captures_into_the_broker_and_syncs_from_it() -> None:
    services = _compose()["services"]
    broker, capture, sync = services["kafka"], services["capture-kafka"], services["sync-kafka"]
    assert broker["profiles"] == capture["profiles"] == sync["profiles"] == ["kafka"]
    assert broker["environment"]["KAFKA_ADVERTISED_LISTENERS"] == "PLAINTEXT://kafka:9092"
    # one broker: the transaction log must fit it, or the capture's transactional producer never starts
    assert broker["environment"]["KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR"] == "1"
    assert capture["environment"]["CDC_LOG"] == sync["environment"]["CDC_LOG"] == "kafka://kafka:9092"
    assert capture["depends_on"]["kafka"]["condition"] == "service_healthy"
    # its own slot and views: the embedded pipeline's services may run beside it
    assert capture["environment"]["CDC_SLOT"] != services["capture"]["environment"]["CDC_SLOT"]
    assert capture["volumes"] == sync["volumes"] != services["sync"]["volumes"]


def test_scheduled_sync_attaches_to_the_spark_server_over_the_same_data_volume() -> None:
    services = _compose()["services"]
    spark, sync_once = services["spark"], services["sync-once"]
    assert spark["command"][0] == "spark-server" and "--host" in spark["command"]
    assert sync_once["environment"]["CDC_SPARK_REMOTE"] == "sc://spark:15002"
    data_dir = sync_once["environment"]["CDC_DATA_DIR"]
    # the server writes the tables at the paths the command sends: the same volume at the same path
    assert f"cdc-data:{data_dir}" in spark["volumes"] and f"cdc-data:{data_dir}" in sync_once["volumes"]
