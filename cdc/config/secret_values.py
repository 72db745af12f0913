"""Secrets of the settings, read and joined so that they never show.

The database password, the mask and request keys and Kafka's passwords may be read from files instead:
``CDC_<NAME>_FILE`` names a file whose content, less its trailing line break, is the value
(:data:`SECRET_FILES`, :func:`read_secret_file`), as container platforms mount secrets. The database
password joins the connection URL as its ``password`` parameter (:func:`with_password`), which
:func:`cdc.config.redact.redact_url` hides wherever the URL is shown; a URL whose password libpq would
misread (:func:`misread_by_libpq`) is refused without quoting it.
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import quote

from cdc.errors import ConfigError

#: The secrets that ``CDC_<NAME>_FILE`` may give from a file instead of ``CDC_<NAME>``.
SECRET_FILES = ("database_password", "mask_key", "request_key", "kafka_sasl_password", "kafka_ssl_key_password")


#: A ``%`` that does not start a percent-encoded byte, or a space: libpq rejects the URL and quotes the part.
_UNENCODED = re.compile(r"%(?![0-9A-Fa-f]{2})|\s")


def misread_by_libpq(url: str) -> bool:
    """Whether libpq would not read the URL's user name and password as written: a reserved character in them.

    libpq takes the user name and password up to the *first* ``@`` before the first ``/`` after
    ``scheme://``, and the host after it. So a second ``@`` there (an ``@`` in the password), an ``@``
    after that ``/`` but before the query (a ``/`` in the password), or a ``%`` or space that libpq
    cannot decode means the password is not the one meant, and libpq's error (a host it cannot
    resolve, a port it cannot read, a token it cannot decode) would show part of it. ``:``, ``?`` and
    ``#`` in a password are read as written. Anything else libpq cannot parse is treated the same way,
    since its message quotes what it could not read.
    """
    from psycopg.conninfo import conninfo_to_dict

    authority, _, path = url.split("://", 1)[1].partition("/")
    if authority.count("@") > 1 or "@" in path.split("?", 1)[0]:
        return True
    if _UNENCODED.search(authority.rpartition("@")[0]):
        return True
    try:
        conninfo_to_dict(url)
    except Exception:  # noqa: BLE001 - psycopg's message quotes the unreadable part, which may be the password
        return True
    return False


def with_password(url: str, password: str) -> str:
    """``url`` with ``password`` as its ``password`` parameter, percent-encoded (libpq decodes it)."""
    separator = "&" if "?" in url else "?"
    return f"{url}{separator}password={quote(password, safe='')}"


def read_secret_file(path: Path, setting: str) -> str:
    """A secret file's text without its trailing line break (``echo`` and editors add one)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else "it is not UTF-8 text"
        raise ConfigError(f"setting {setting} names {path}, which cannot be read: {reason}") from None
    text = text.rstrip("\r\n")
    if not text:
        raise ConfigError(f"setting {setting} names {path}, which is empty")
    return text
