"""The oldest server capture reads is PostgreSQL 14: an older one is refused with the fix (pure rule)."""

from __future__ import annotations

import pytest

from cdc.setup.source_checks import server_version_check


@pytest.mark.parametrize("server_version", [140000, 140024, 150014, 180006])
def test_a_supported_server_passes(server_version: int) -> None:
    assert server_version_check(server_version).ok


@pytest.mark.parametrize(("server_version", "shown"), [(130022, "13.22"), (120000, "12.0"), (90624, "9.6.24")])
def test_an_older_server_fails_naming_its_version_and_the_fix(server_version: int, shown: str) -> None:
    check = server_version_check(server_version)
    assert not check.ok
    assert f"PostgreSQL {shown}" in check.message and "14 or newer" in check.message and "upgrade" in check.message
