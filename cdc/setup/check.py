"""One check of ``cdc setup``'s and its outcome: each failed one is a line that says what is wrong and how to fix it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Check:
    """The outcome of one check."""

    name: str
    ok: bool
    message: str
    #: a passed check whose ``message`` is still worth reading (a consequence the user should know)
    warning: bool = False
