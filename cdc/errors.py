"""The application's root errors: every error the user can act on is a :class:`CdcError`.

The CLI prints ``str(error)`` as one line and exits with :attr:`CdcError.exit_code`; nothing else of a
:class:`CdcError` reaches the user, so the message must be complete on its own. Capture's errors
(:mod:`cdc.capture.errors`) derive from these; this module imports nothing of the project, so every
package of ``cdc`` (capture included) may import it.
"""

from __future__ import annotations


class CdcError(Exception):
    """Base of every error the user can act on. ``exit_code`` is what the CLI exits with."""

    exit_code: int = 1


class ConfigError(CdcError):
    """A setting or command-line value is invalid."""

    exit_code = 2
