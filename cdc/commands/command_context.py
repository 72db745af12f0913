"""What the sub-commands of one ``cdc`` invocation share: the settings, loaded once when first asked for.

The root group (:mod:`cdc.cli`) makes the object; a command receives it through :data:`pass_context`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from cdc.config.settings import Settings


class CommandContext:
    """Lazily loaded settings shared by the sub-commands of one invocation."""

    def __init__(self) -> None:
        self._settings: Settings | None = None

    @property
    def settings(self) -> Settings:
        if self._settings is None:
            from cdc.config.settings import load_settings  # loads pyarrow: not before a command runs

            self._settings = load_settings()
        return self._settings


pass_context = click.make_pass_decorator(CommandContext, ensure=True)
