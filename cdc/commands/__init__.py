"""Sub-commands of ``cdc``, one module per area; :func:`register` attaches them to the root group.

The modules every command shares: :mod:`cdc.commands.command_context` (the settings of one invocation),
:mod:`cdc.commands.run_command` (a failure shown as one line) and :mod:`cdc.commands.interrupts` (a command
that runs until stopped ends on SIGINT or SIGTERM). May import every room of ``cdc`` and the views' entry
point; never :mod:`cdc.cli`, which imports this package (a command reaches the root
group through click's context).
"""

from __future__ import annotations

import click


def register(root: click.Group) -> None:
    """Attach every sub-command to ``root``; each module owns its commands' options and help."""
    from cdc.commands import capture_cmd, consume_cmd, demo_cmd, lag_cmd, log_cmd, setup_cmd, snapshot_cmd, views_cmd

    root.add_command(log_cmd.log_group)
    log_cmd.log_group.add_command(consume_cmd.consume)
    log_cmd.log_group.add_command(consume_cmd.groups)
    root.add_command(demo_cmd.demo)
    root.add_command(demo_cmd.migrate)
    root.add_command(lag_cmd.lag)
    root.add_command(lag_cmd.wait)
    root.add_command(setup_cmd.setup)
    root.add_command(capture_cmd.capture)
    root.add_command(snapshot_cmd.snapshot)
    for command in views_cmd.COMMANDS:
        root.add_command(command)
