"""Hide passwords in connection URLs before they reach a log, an error or a screen."""

from __future__ import annotations

import re

#: The password runs to the *last* ``@`` of the authority (before any ``/``, ``?``, ``#``, quote or space),
#: so a password holding a raw ``@`` is hidden whole.
_URL_PASSWORD = re.compile(
    r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<user>[^:/@\s]*):(?P<pw>[^/?#\s\"']*)@(?=[^@/?#\s\"']*(?:[/?#\s\"']|$))"
)
_KV_PASSWORD = re.compile(r"""(?P<key>password\s*=\s*)(?P<pw>'[^']*'|[^\s"',}&;]+)""", re.IGNORECASE)

REDACTED = "***"


def redact_url(text: str) -> str:
    """Replace the password of every ``scheme://user:password@host`` URL and ``password=`` pair."""
    text = _URL_PASSWORD.sub(lambda m: f"{m['scheme']}{m['user']}:{REDACTED}@", text)
    return _KV_PASSWORD.sub(lambda m: f"{m['key']}{REDACTED}", text)
