"""Failover slots: when the slot is made one, and the line (with its fix) for each missing piece of slot sync (pure rules)."""

from __future__ import annotations

import pytest

from cdc.errors import ConfigError
from cdc.setup.failover import PrimaryFacts, StandbyFacts, failover_problems, failover_wanted

READY_PRIMARY = PrimaryFacts(170011, ("standby_1",), ("standby_1",), True)
READY_STANDBY = StandbyFacts(
    in_recovery=True,
    sync_replication_slots=True,
    hot_standby_feedback=True,
    primary_slot_name="standby_1",
    conninfo_has_dbname=True,
    slot_synced=True,
)


@pytest.mark.parametrize(
    ("mode", "version", "synchronized", "standby", "wanted"),
    [
        ("auto", 170011, "standby_1", False, True),  # the primary names a standby
        ("auto", 170011, "", True, True),  # CDC_STANDBY_URL names one
        ("auto", 170011, "", False, False),  # no standby configured
        ("auto", 160015, "", True, False),  # 16 has no failover slots: the slot-lost path
        ("true", 170011, "", False, True),
        ("true", 180006, "", False, True),
        ("false", 170011, "standby_1", True, False),
        ("false", 140024, "", True, False),
    ],
)
def test_the_slot_is_a_failover_slot_on_17_and_later_when_a_standby_is_configured(
    mode: str, version: int, synchronized: str, standby: bool, wanted: bool
) -> None:
    assert failover_wanted(mode, version, synchronized, standby) is wanted


@pytest.mark.parametrize("version", [140024, 150014, 160015])
def test_failover_true_before_17_is_one_error_with_its_fix(version: int) -> None:
    with pytest.raises(ConfigError, match=r"=true needs PostgreSQL 17 or newer.*CDC_SLOT_FAILOVER=auto or false"):
        failover_wanted("true", version, "", False)


def test_a_ready_pair_has_no_problem() -> None:
    assert failover_problems(READY_PRIMARY, READY_STANDBY, "cdc_slot", "shop") == []
    assert failover_problems(READY_PRIMARY, None, "cdc_slot", "shop") == []


@pytest.mark.parametrize(
    ("primary", "standby", "expected"),
    [
        (
            PrimaryFacts(170011, (), ("standby_1",), True),
            READY_STANDBY,
            "ALTER SYSTEM SET synchronized_standby_slots = 'standby_1'",
        ),
        (
            PrimaryFacts(170011, ("gone",), ("standby_1",), True),
            StandbyFacts(True, True, True, "gone", True, True),
            "SELECT pg_create_physical_replication_slot('gone')",
        ),
        (
            PrimaryFacts(170011, ("other",), ("other", "standby_1"), True),
            READY_STANDBY,
            "ALTER SYSTEM SET synchronized_standby_slots = 'other, standby_1'",
        ),
        (READY_PRIMARY, StandbyFacts(True, False, True, "standby_1", True, True), "ALTER SYSTEM SET sync_replication_slots = on"),
        (READY_PRIMARY, StandbyFacts(True, True, False, "standby_1", True, True), "ALTER SYSTEM SET hot_standby_feedback = on"),
        (READY_PRIMARY, StandbyFacts(True, True, True, "", True, True), "ALTER SYSTEM SET primary_slot_name = 'standby_1'"),
        (READY_PRIMARY, StandbyFacts(True, True, True, "standby_1", False, True), "dbname=shop"),
        (READY_PRIMARY, StandbyFacts(False, True, True, "standby_1", True, True), "not in recovery"),
    ],
)
def test_each_missing_piece_is_one_fatal_line_with_its_fix(primary: PrimaryFacts, standby: StandbyFacts, expected: str) -> None:
    problems = failover_problems(primary, standby, "cdc_slot", "shop")
    assert len(problems) == 1, problems
    fatal, line = problems[0]
    assert fatal and expected in line and "\n" not in line, line


def test_a_slot_not_synced_yet_is_a_warning_not_a_failure() -> None:
    problems = failover_problems(READY_PRIMARY, StandbyFacts(True, True, True, "standby_1", True, False), "cdc_slot", "shop")
    assert [(fatal, "cdc_slot is not synced to the standby yet" in line) for fatal, line in problems] == [(False, True)]
    before_setup = PrimaryFacts(170011, ("standby_1",), ("standby_1",), None)  # no slot on the primary yet
    assert failover_problems(before_setup, StandbyFacts(True, True, True, "standby_1", True, None), "cdc_slot", "shop") == []


def test_a_slot_made_before_failover_was_configured_is_a_warning_setup_cures() -> None:
    primary = PrimaryFacts(170011, ("standby_1",), ("standby_1",), False)
    problems = failover_problems(primary, StandbyFacts(True, True, True, "standby_1", True, None), "cdc_slot", "shop")
    assert [(fatal, "no failover slot: `cdc setup` makes it one" in line) for fatal, line in problems] == [(False, True)]


def test_every_missing_piece_is_named_at_once() -> None:
    problems = failover_problems(
        PrimaryFacts(170011, (), ("standby_1",), True), StandbyFacts(True, False, False, "", False, False), "cdc_slot", "shop"
    )
    assert [fatal for fatal, _ in problems] == [True, True, True, True, True, False]
