"""The slot-creating replication command in the syntax of each server version (14 lacks the parenthesised options)."""

from __future__ import annotations

import pytest

from cdc.capture.errors import SlotError
from cdc.capture.transport.connection import create_slot_command


@pytest.mark.parametrize(
    ("server_version", "export_snapshot", "temporary", "expected"),
    [
        (140024, True, False, 'CREATE_REPLICATION_SLOT "s" LOGICAL pgoutput EXPORT_SNAPSHOT'),
        (149999, False, True, 'CREATE_REPLICATION_SLOT "s" TEMPORARY LOGICAL pgoutput NOEXPORT_SNAPSHOT'),
        (150000, True, False, "CREATE_REPLICATION_SLOT \"s\" LOGICAL pgoutput (SNAPSHOT 'export')"),
        (180006, False, True, "CREATE_REPLICATION_SLOT \"s\" TEMPORARY LOGICAL pgoutput (SNAPSHOT 'nothing')"),
    ],
)
def test_the_slot_command_uses_the_syntax_the_server_version_knows(
    server_version: int, export_snapshot: bool, temporary: bool, expected: str
) -> None:
    command = create_slot_command("s", export_snapshot=export_snapshot, temporary=temporary, server_version=server_version)
    assert command == expected


def test_a_failover_slot_asks_for_failover_on_17_and_later() -> None:
    command = create_slot_command("s", export_snapshot=True, temporary=False, server_version=170011, failover=True)
    assert command == "CREATE_REPLICATION_SLOT \"s\" LOGICAL pgoutput (SNAPSHOT 'export', FAILOVER)"


def test_a_failover_slot_on_16_is_refused_with_the_setting_that_turns_it_off() -> None:
    with pytest.raises(SlotError, match="PostgreSQL 17 or newer.*CDC_SLOT_FAILOVER=false"):
        create_slot_command("s", export_snapshot=True, temporary=False, server_version=160015, failover=True)
