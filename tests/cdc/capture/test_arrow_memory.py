"""``cdc capture`` turns transparent huge pages off for Arrow's allocator, unless the environment chose;
importing ``cdc`` changes nothing."""

from __future__ import annotations

import os
import subprocess
import sys

from cdc.capture.arrow_memory import THP_OPTION


def _allow_thp_after(code: str, **env: str) -> str:
    """mimalloc's ``allow_thp`` as it reports it (verbose) in a fresh interpreter that runs ``code``."""
    # pyarrow's default pool (mimalloc) unless the environment picks another: this test needs mimalloc
    base = {k: v for k, v in os.environ.items() if k not in (THP_OPTION, "ARROW_DEFAULT_MEMORY_POOL")}
    done = subprocess.run(
        [sys.executable, "-c", code],
        env={**base, "MIMALLOC_VERBOSE": "1", **env},
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    lines = [line for line in done.stderr.splitlines() if "option 'allow_thp'" in line]
    assert len(lines) == 1, done.stderr
    return lines[0].rsplit(":", 1)[1].strip()


def _command(*args: str) -> str:
    """Code that runs ``cdc ARGS`` as the console script does, then allocates with pyarrow."""
    return (
        f"import sys; sys.argv = ['cdc', *{list(args)!r}]\n"
        "from cdc.cli import main\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "import pyarrow; pyarrow.array([1])"
    )


def test_capture_asks_for_ordinary_pages() -> None:
    assert _allow_thp_after("import pyarrow; pyarrow.array([1])") == "1"  # mimalloc's own default
    assert _allow_thp_after(_command("capture", "--help")) == "0"


def test_importing_cdc_or_another_command_changes_nothing() -> None:
    assert _allow_thp_after("import cdc.capture.snapshot, pyarrow; pyarrow.array([1])") == "1"
    assert _allow_thp_after(_command("log", "--help")) == "1"


def test_a_choice_in_the_environment_is_kept() -> None:
    assert _allow_thp_after(_command("capture", "--help"), **{THP_OPTION: "1"}) == "1"
