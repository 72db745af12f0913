"""``cdc setup``: check the source's prerequisites, then create publication and slot if missing.

The tables are judged as the publication covers them, or would once created: ``CDC_TABLES`` when set
(the publication is then created for those tables only), else every table of a ``FOR ALL TABLES``
publication. Any failed check creates nothing.
"""

from __future__ import annotations

import click

from cdc.capture.errors import PrerequisiteError
from cdc.commands.command_context import pass_context
from cdc.setup.source_checks import run_checks
from cdc.setup.source_objects import apply_declared_rules, ensure_publication, ensure_slot


@click.command("setup")
@click.option("--check-only", is_flag=True, help="Only check; create nothing.")
@pass_context
def setup(ctx: object, check_only: bool) -> None:
    """Check wal_level, privileges, free slots and keys; create the publication and slot (idempotent)."""
    settings = ctx.settings  # type: ignore[attr-defined]
    checks = run_checks(settings)
    failed = [check for check in checks if not check.ok]
    for check in checks:
        label = "FAIL" if not check.ok else "warn" if check.warning else "ok  "
        click.echo(f"{label} {check.name}" + (f": {check.message}" if label != "ok  " else ""))
    if failed:
        raise PrerequisiteError([check.message for check in failed])  # one error line each; nothing created
    if check_only:
        return
    created = ensure_publication(settings)
    click.echo(f"publication {settings.publication}: {'created' if created else 'exists'}")
    for table in [] if created else apply_declared_rules(settings):
        click.echo(
            f"publication {settings.publication}: {table} given the rule the views file declares "
            "(a running capture reads it again under the rule)"
        )
    created = ensure_slot(settings)
    click.echo(f"slot {settings.slot}: {'created' if created else 'exists'}")
