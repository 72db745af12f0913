"""cdc snapshot --status on a terminal: a bar per read with its rows, rate and time left."""

from __future__ import annotations

from rich.console import Console

from cdc.commands.snapshot_cmd import status_bars


def _shown(reads: list[dict[str, object]]) -> list[str]:
    console = Console(record=True, force_terminal=True, width=100, color_system=None)
    console.print(status_bars(reads))
    return [line.strip() for line in console.export_text().splitlines()]


def test_each_read_gets_a_bar_of_its_rows_over_the_estimate_with_rate_and_time_left() -> None:
    reads: list[dict[str, object]] = [
        {"table": "public.big", "rows": 25_000, "estimated_rows": 100_000, "rows_per_second": 5_000.0, "eta_seconds": 15.0},
        {"table": "public.other", "rows": 700, "estimated_rows": None, "rows_per_second": None, "eta_seconds": None},
    ]
    header, big, other = _shown(reads)
    assert header.split() == ["table", "progress", "rows", "rate", "left"]
    assert big.startswith("public.big") and "25,000/100,000" in big and "5,000 rows/s" in big and big.endswith("15 s")
    bar = big.split()[1]
    assert 6 <= bar.count("━") <= 9 and len(bar) <= 30, bar  # a quarter of a 30-wide bar is drawn solid
    assert other.split() == ["public.other", "700"], other  # no estimate: no bar


def test_a_read_past_its_estimate_shows_a_full_bar() -> None:
    (_, line) = _shown([{"table": "t", "rows": 12, "estimated_rows": 10, "rows_per_second": 1.0, "eta_seconds": 0.0}])
    assert "12/12" in line
