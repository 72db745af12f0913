"""Every error the CLI prints is one ``error: ...`` line, usage errors included, and set-up logs stay quiet."""

from __future__ import annotations

import subprocess
import sys

import pytest

from cdc.cli import _register_commands, cli, run


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["capture", "--bogus"], "error: No such option '--bogus'; see 'cdc capture --help'"),
        (["nosuch"], "error: No such command 'nosuch'; see 'cdc --help'"),
        (
            ["sync", "--interval", "x"],
            "error: Invalid value for '--interval': 'x' is not a valid float range; see 'cdc sync --help'",
        ),
    ],
)
def test_a_usage_error_is_one_error_line_with_exit_2(args: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    _register_commands()
    assert run(cli, args) == 2
    captured = capsys.readouterr()
    assert captured.err.splitlines() == [message]
    assert captured.out == ""


def test_alembic_prints_no_plugin_lines_under_the_cli_logging() -> None:
    """Alembic logs a ``setup plugin ...`` line per plugin at import; the demo's first step must not show them."""
    code = "from cdc.observe import structured_log; structured_log.configure(); import alembic.command, alembic.config"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "setup plugin" not in result.stderr
    assert result.stderr == ""
