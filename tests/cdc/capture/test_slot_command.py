"""The slot-creating replication command in the syntax of each server version (14 lacks the parenthesised options)."""

from __future__ import annotations

import pytest

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
