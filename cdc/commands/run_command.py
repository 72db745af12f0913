"""Running a ``cdc`` command: a failure the user can act on becomes one ``error: ...`` line on stderr and
an exit status, never a traceback (:func:`run`). It imports no command, so a command may run others
(``cdc demo`` does) without an import loop through the root group.
"""

from __future__ import annotations

import importlib
import re
import traceback

import click

from cdc.errors import CdcError, ConfigError


def _user_errors() -> tuple[type[BaseException], ...]:
    """Error types whose message is meant for the user, from every part of the pipeline."""
    from log_store.errors import LogStoreError

    errors: list[type[BaseException]] = [CdcError, LogStoreError]
    try:
        from derived_views.errors import ViewError
    except ImportError:  # pragma: no cover - the views package is optional at import time
        pass
    else:
        errors.append(ViewError)
    return tuple(errors)


#: A user error raised inside a Spark task reaches the driver as a Java/Python exception whose text holds
#: the worker's traceback, ending with the original ``module.errors.ClassName: message`` line.
_REMOTE_ERROR = re.compile(
    r"^\s*(?P<module>(?:cdc|log_store|derived_views)\.errors)\.(?P<name>\w+): (?P<message>.+)$", re.MULTILINE
)


def remote_user_error(exc: BaseException) -> tuple[str, int] | None:
    """The message and exit code of a user error that a Spark task raised, found in ``exc``'s text.

    ``None`` when ``exc`` does not come from Spark or carries no such error.
    """
    if not type(exc).__module__.startswith(("pyspark", "py4j")):
        return None
    found = list(_REMOTE_ERROR.finditer(str(exc)))
    if not found:
        return None
    last = found[-1]
    error_type = getattr(importlib.import_module(last["module"]), last["name"], None)
    if not (isinstance(error_type, type) and issubclass(error_type, _user_errors())):
        return None
    from cdc.run.log_rebuild import with_rebuild_steps

    return with_rebuild_steps(last["message"].strip(), error_type), int(getattr(error_type, "exit_code", 1))


def _storage_error(exc: OSError) -> CdcError:
    """The one-line error of a file operation the operating system refused (see :mod:`cdc.run.storage_errors`)."""
    from pathlib import Path

    from cdc.config.settings import load_settings
    from cdc.run.storage_errors import storage_error

    try:
        data_dir = load_settings().data_dir
    except ConfigError:
        data_dir = Path(".")
    return storage_error(exc, data_dir, f"cannot use the data directory {data_dir} (CDC_DATA_DIR)")


def run(entry: click.Command, args: list[str] | None = None) -> int:
    """Run a click entry point, turning user errors into one line on stderr and an exit status."""
    from cdc.config.redact import redact_url
    from cdc.run.log_rebuild import with_rebuild_steps

    try:
        entry.main(args=args, prog_name="cdc", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        return 130
    except click.exceptions.Exit as exc:
        return int(exc.exit_code)
    except click.UsageError as exc:
        # click's own form is a usage line, a hint and ``Error: ...``: every error here is one line
        command = exc.ctx.command_path if exc.ctx is not None else "cdc"
        click.echo(f"error: {exc.format_message().rstrip('.')}; see '{command} --help'", err=True)
        return exc.exit_code
    except click.ClickException as exc:
        click.echo(f"error: {exc.format_message()}", err=True)
        return exc.exit_code
    except _user_errors() as exc:
        for problem in getattr(exc, "problems", None) or (with_rebuild_steps(str(exc), exc),):
            click.echo(f"error: {redact_url(problem)}", err=True)
        return int(getattr(exc, "exit_code", 1))
    except OSError as exc:
        # the disk refused a file operation (full, permission bits, a file for a directory): the user's to fix
        error = _storage_error(exc)
        click.echo(f"error: {redact_url(str(error))}", err=True)
        return error.exit_code
    except Exception as exc:
        remote = remote_user_error(exc)
        if remote is not None:
            click.echo(f"error: {redact_url(remote[0])}", err=True)
            return remote[1]
        # an unexpected failure: keep the traceback, but never a password
        click.echo(redact_url(traceback.format_exc()), err=True, nl=False)
        return 1
    return 0
