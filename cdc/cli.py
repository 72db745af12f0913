"""The ``cdc`` command line: one entry point for set-up, capture, sync, rebuild, lag and the log.

Every command reads :class:`cdc.config.settings.Settings`; a failure the user can act on is printed as a single
``error: ...`` line on stderr with a non-zero exit status, never as a traceback.
"""

from __future__ import annotations

import sys

import click

from cdc.commands.command_context import CommandContext
from cdc.commands.run_command import run
from cdc.errors import ConfigError
from cdc.observe import structured_log

#: the commands that run capture in this process: Arrow's allocator is set up for them before pyarrow loads
_CAPTURING_COMMANDS = ("capture", "demo")


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="pg-cdc", prog_name="cdc")
@click.pass_context
def cli(ctx: click.Context) -> None:
    """Change-data-capture from PostgreSQL into a compacted log and exact Delta Lake views.

    Settings come from CDC_* environment variables or a .env file; see the README.
    """
    from cdc.config.settings import load_settings

    ctx.ensure_object(CommandContext)
    try:
        log_format = load_settings().log_format
    except ConfigError:
        log_format = "kv"  # the command itself reports the bad setting
    structured_log.configure(log_format)


def _register_commands() -> None:
    """Attach the commands that live in their own modules."""
    from cdc.commands import register

    register(cli)


def _command_name(args: list[str]) -> str | None:
    """The sub-command ``args`` name: the first argument that is not an option of the root group."""
    return next((arg for arg in args if not arg.startswith("-")), None)


def main() -> None:
    """Console-script entry point (``cdc``)."""
    if _command_name(sys.argv[1:]) in _CAPTURING_COMMANDS:
        # before the commands' modules load pyarrow: mimalloc reads its options then, once
        from cdc.capture.arrow_memory import use_ordinary_pages

        use_ordinary_pages()
    _register_commands()
    sys.exit(run(cli))


__all__ = ["cli", "main", "run"]
