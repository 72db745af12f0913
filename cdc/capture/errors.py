"""Errors the capture side raises; each carries what went wrong and how to fix it.

Each derives from the application's root errors (:mod:`cdc.errors`): the CLI prints ``str(error)`` as
one line and exits with :attr:`~cdc.errors.CdcError.exit_code`, so the message must be complete on its own.
"""

from __future__ import annotations

from collections.abc import Sequence

from cdc.errors import CdcError


class SourceError(CdcError):
    """The source database is unreachable or misconfigured for logical decoding."""

    exit_code = 3


class PrerequisiteError(SourceError):
    """One or more prerequisites of capture are not met; each problem is a complete message with its fix.

    The CLI prints one ``error:`` line per problem (:attr:`problems`), so that every fix is seen at once.
    """

    def __init__(self, problems: Sequence[str]) -> None:
        super().__init__("; and ".join(problems))
        self.problems: tuple[str, ...] = tuple(problems)


class SlotError(SourceError):
    """The replication slot is missing, invalidated or in use by another process."""


class SlotLostError(SlotError):
    """The replication slot is gone or invalidated: the log cannot go on from it. By default capture stops;
    with ``CDC_RECREATE_LOST_SLOT`` its next run makes the slot again and reads every table again."""


class PrivilegeError(SourceError):
    """The capture role lacks a privilege a step needs; the message names the grant that fixes it."""


class DecodeError(CdcError):
    """A pgoutput message could not be decoded (names the message type and LSN)."""


class MissingValueError(CdcError):
    """An update changed a row's key and left a TOAST value unchanged that neither the server nor the log holds.

    Raised instead of writing the row without that value (promise 4); nothing of the transaction is
    appended and the slot is not confirmed past it, so no data is lost.
    """

    exit_code = 4


def connection_failure(exc: BaseException) -> str:
    """The first line of libpq's message for a connection that failed, with the fix when it is TLS's.

    ``sslmode=verify-full`` (and ``verify-ca``) fail with a bare ``certificate verify failed`` or
    ``server certificate for "X" does not match host name "Y"``; each gets what to change in the URL.
    """
    text = str(exc).strip()
    line = text.splitlines()[0] if text else type(exc).__name__
    if "certificate verify failed" in line:
        line += (
            " (the server's certificate is not signed by the CA the URL's sslrootcert names: "
            "set sslrootcert to the file of the CA that signed it)"
        )
    elif "does not match host name" in line:
        line += (
            " (the server's certificate does not name the host the URL connects to: connect by a name it "
            "holds, or use sslmode=verify-ca, which checks the CA alone)"
        )
    return line
