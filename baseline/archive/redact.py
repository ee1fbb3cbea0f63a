"""Free text in the monitor's records that may carry a secret or a person, made safe to archive.

An alert's message names the participant as the monitor board shows them (their display name);
a delivery's target is the study's e-mail recipients or its webhook URL, and its error may quote
the deployment's ``BASELINE_SMTP_URL`` or an SMTP server's refusal of an address. A webhook URL
is often itself a bearer secret (a token in its path or query) and an SMTP URL may hold a
password. So, in those columns, every URL is cut to its origin (``scheme://host:port``), every
e-mail address is replaced, and every participant's display name becomes their pseudonym: the
auditor still sees what fired, when, and whether and where it was delivered.

Hosts are not in the archive (no table, and workspaces travel without theirs): a host's name is
the coordinator's label, often the machine's DNS name or address, and its last error, which a
``host_down`` alert quotes, holds SSH's or Docker's words about it (address, user name, port,
key path, socket). So an alert names a host as its subject does (``host:3`` is "host 3"): a
``host_down`` message says only that the host was down (its alert says since when), and a
``workspace_dead`` one which host the workspace was on, not the workspace's name (which carries
the home's attempt id, and names no archived row).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from baseline.models import AlertRule

# The columns whose text is redacted, by table.
REDACTED: dict[str, frozenset[str]] = {
    "monitor_settings": frozenset({"webhook_url"}),
    "alerts": frozenset({"message"}),
    "alert_deliveries": frozenset({"target", "error"}),
}
ADDRESS = "<e-mail address>"

_URL = re.compile(r"\b[a-zA-Z][a-zA-Z0-9+.-]*://[^\s'\"<>]+")
_EMAIL = re.compile(r"[^@\s,;:<>'\"()\[\]]+@[^@\s,;:<>'\"()\[\]]+\.[A-Za-z0-9-]+")
# The tail of a workspace_dead message (`baseline.monitor.rules`): the workspace, then its host.
_DEAD_WORKSPACE = re.compile(r": workspace \S+ on (?P<host>.+) is dead, not restarted$")
_HOST_DOWN = "is down (its error is not archived)"


def origin(url: str) -> str:
    """``scheme://host[:port]`` of a URL: no credentials, path, query or fragment."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}"


class Redactor:
    """Redacts one study's records (`names`: each participant's display name -> pseudonym;
    `hosts`: each host's name -> its id, as alert subjects name hosts)."""

    def __init__(self, names: Mapping[str, str], hosts: Mapping[str, int]) -> None:
        self._hosts = dict(hosts)
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
        if table == "alerts" and isinstance(record.get("message"), str):
            record = record | {"message": self._hosts_named(record)}
        columns = REDACTED.get(table, frozenset())
        return {
            key: self.text(value) if key in columns and isinstance(value, str) else value
            for key, value in record.items()
        }

    def _hosts_named(self, alert: dict[str, Any]) -> str:
        """An alert's message naming its host as the archive does, without the host's error."""
        message = str(alert["message"])
        if alert["rule"] == AlertRule.HOST_DOWN.value:
            kind, _, host_id = str(alert["subject"]).partition(":")
            host = f"host {host_id}" if kind == "host" and host_id.isdigit() else "a host"
            return f"{host} {_HOST_DOWN}"
        if alert["rule"] == AlertRule.WORKSPACE_DEAD.value:
            return _DEAD_WORKSPACE.sub(
                lambda m: f": workspace on {self._host(m.group('host'))} is dead, not restarted",
                message,
            )
        return message

    def _host(self, name: str) -> str:
        if name == "?":  # the rule's word for a workspace placed on no host
            return name
        host_id = self._hosts.get(name)
        return "a host" if host_id is None else f"host {host_id}"
