"""Free text in the monitor's records that may carry a secret or a person, made safe to archive.

An alert's message names the participant as the monitor board shows them (their display name);
a delivery's target is the study's e-mail recipients or its webhook URL, and its error may quote
the deployment's ``BASELINE_SMTP_URL`` or an SMTP server's refusal of an address. A webhook URL
is often itself a bearer secret (a token in its path or query) and an SMTP URL may hold a
password. So, in those columns, every URL is cut to its origin (``scheme://host:port``), every
e-mail address is replaced, and every participant's display name becomes their pseudonym: the
auditor still sees what fired, when, and whether and where it was delivered.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

# The columns whose text is redacted, by table.
REDACTED: dict[str, frozenset[str]] = {
    "monitor_settings": frozenset({"webhook_url"}),
    "alerts": frozenset({"message"}),
    "alert_deliveries": frozenset({"target", "error"}),
}
ADDRESS = "<e-mail address>"

_URL = re.compile(r"\b[a-zA-Z][a-zA-Z0-9+.-]*://[^\s'\"<>]+")
_EMAIL = re.compile(r"[^@\s,;:<>'\"()\[\]]+@[^@\s,;:<>'\"()\[\]]+\.[A-Za-z0-9-]+")


def origin(url: str) -> str:
    """``scheme://host[:port]`` of a URL: no credentials, path, query or fragment."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}"


class Redactor:
    """Redacts one study's records (`names`: each participant's display name -> pseudonym)."""

    def __init__(self, names: Mapping[str, str]) -> None:
        named = sorted((n for n, p in names.items() if n.strip() and n != p), key=len, reverse=True)
        self._names = dict(names)
        self._name = (
            re.compile("|".join(rf"(?<!\w){re.escape(n)}(?!\w)" for n in named)) if named else None
        )

    def text(self, value: str) -> str:
        value = _URL.sub(lambda m: origin(m.group(0)), value)
        value = _EMAIL.sub(ADDRESS, value)
        if self._name is not None:
            value = self._name.sub(lambda m: self._names[m.group(0)], value)
        return value

    def record(self, table: str, record: dict[str, Any]) -> dict[str, Any]:
        """`record` (a Parquet record of `table`) with its redacted columns made safe."""
        columns = REDACTED.get(table, frozenset())
        return {
            key: self.text(value) if key in columns and isinstance(value, str) else value
            for key, value in record.items()
        }
