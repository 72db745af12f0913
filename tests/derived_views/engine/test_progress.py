"""A view table's progress as a plain value: its JSON in a Delta commit read back, and the least offsets of several."""

from __future__ import annotations

from derived_views.engine.progress import Progress, min_offsets


def test_progress_round_trips_and_ignores_foreign_metadata() -> None:
    progress = Progress({"cdc.public.products": {"0": 3, "1": 9}}, "0000000000001A00", 123)
    assert Progress.from_json(progress.to_json()) == progress
    assert progress.lsn == 0x1A00
    assert Progress.from_json("nightly OPTIMIZE") is None and Progress.from_json(None) is None
    other = Progress({"cdc.public.products": {"0": 1, "1": 12}})
    assert min_offsets([progress, other], ["cdc.public.products"]) == {"cdc.public.products": {"0": 1, "1": 9}}
