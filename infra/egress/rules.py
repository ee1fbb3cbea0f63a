"""Egress decisions: the policy of a workspace and the URL in, allowed or refused out.

Standard library only: the proxy addon imports this file from the proxy's own venv, so the portal
and the proxy decide with the same code. A blacklist entry is a URL; a request is refused when its
host is the entry's host (case-blind, `www.` ignored) and its path starts with the entry's path at
a segment boundary (case-blind, percent-decoded, a trailing `.git` on a segment ignored, since
`git clone` asks for `owner/repo.git/...`). An entry naming a GitHub repository or owner
(`github.com/OWNER/REPO`, as PaperBench lists them) also covers the other hosts GitHub serves that
repository's files from (`GITHUB_CONTENT_HOSTS`): otherwise its archive or raw files would be one
other URL away.
"""

from __future__ import annotations

import ipaddress
import json
import posixpath
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlsplit

MODES = ("none", "open", "blacklist")


GITHUB = "github.com"

# Where GitHub serves a repository's content besides github.com/OWNER/REPO: each host with the path
# that comes before OWNER/REPO there. Case-blind like GitHub itself (`_path` lowers paths).
GITHUB_CONTENT_HOSTS: tuple[tuple[str, str], ...] = (
    ("codeload.github.com", ""),  # archives: /OWNER/REPO/zip/REF, /tar.gz/REF, /legacy.zip/REF
    ("api.github.com", "/repos"),  # /repos/OWNER/REPO/zipball, /tarball, /contents, /git/blobs
    ("raw.githubusercontent.com", ""),  # files: /OWNER/REPO/REF/PATH
    ("raw.github.com", ""),  # the old name of raw.githubusercontent.com
    ("media.githubusercontent.com", "/media"),  # Git LFS files: /media/OWNER/REPO/REF/PATH
)


@dataclass(frozen=True)
class BlacklistRule:
    host: str
    path_prefix: str  # normalised, "/" means the whole host
    source: str  # the entry as written

    @classmethod
    def parse(cls, entry: str) -> BlacklistRule:
        text = entry.strip()
        if "://" not in text:
            text = f"https://{text}"
        parts = urlsplit(text)
        host = _host(parts.hostname or "")
        if not host:
            raise ValueError(f"blacklist entry {entry!r} has no host")
        return cls(host=host, path_prefix=_path(parts.path), source=entry.strip())

    @property
    def places(self) -> tuple[tuple[str, str], ...]:
        """Every (host, path prefix) the entry refuses: its own and, for an entry that is a
        GitHub owner or repository (one or two path segments), the same OWNER/REPO on each of
        `GITHUB_CONTENT_HOSTS`. A deeper entry (a file, a folder of a repository) stays on
        github.com: the other hosts lay out such paths differently."""
        own = ((self.host, self.path_prefix),)
        segments = self.path_prefix.strip("/").split("/")
        if self.host != GITHUB or not segments[0] or len(segments) > 2:
            return own
        return own + tuple((host, base + self.path_prefix) for host, base in GITHUB_CONTENT_HOSTS)

    def matches(self, host: str, path: str) -> bool:
        name = _host(host)
        have = _path(path).rstrip("/").split("/")
        for place, prefix in self.places:
            wanted = prefix.rstrip("/").split("/")  # "/", the whole host, is [""]: every path
            if place == name and have[: len(wanted)] == wanted:
                return True
        return False


def _host(host: str) -> str:
    host = host.strip().lower().rstrip(".")
    return host[4:] if host.startswith("www.") else host


def _path(path: str) -> str:
    decoded = unquote(path or "/").lower()
    normal = posixpath.normpath("/" + decoded.lstrip("/"))
    segments = [s[:-4] if s.endswith(".git") and len(s) > 4 else s for s in normal.split("/")]
    return "/".join(segments) or "/"


PRIVATE_RULE = "private address"


def is_private_destination(host: str) -> bool:
    """Loopback, private, link-local (cloud metadata) or otherwise non-public: the host's own
    services (portal, database) and the provider's internals are never a workspace's to reach."""
    name = host.strip().strip("[]").lower().rstrip(".")
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        return False
    return not address.is_global


WORKSPACE_NETWORK_RULE = "workspace network"


def in_networks(host: str, networks: str) -> bool:
    """Whether `host` is an address inside one of `networks` (comma-separated CIDRs).

    The workspace networks themselves are never a destination: through the proxy, one workspace
    would otherwise reach another's ports (the proxy runs on the host, which reaches them all).
    """
    name = host.strip().strip("[]")
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        return False
    for cidr in filter(None, (part.strip() for part in networks.split(","))):
        network = ipaddress.ip_network(cidr, strict=False)
        if address.version == network.version and address in network:
            return True
    return False


def parse_blacklist(text: str) -> list[BlacklistRule]:
    """A PaperBench blacklist.txt: one URL a line, `#` comments, the word `none` = no entry."""
    rules: list[BlacklistRule] = []
    for line in text.splitlines():
        entry = line.split("#", 1)[0].strip()
        if not entry or entry.lower() == "none":
            continue
        rules.append(BlacklistRule.parse(entry))
    return rules


@dataclass(frozen=True)
class Decision:
    allowed: bool
    rule: str | None  # why: the blacklist entry, or the policy that refused


@dataclass(frozen=True)
class WorkspacePolicy:
    """What one workspace may reach; the token authenticates it to the proxy."""

    mode: str
    token: str
    blacklist: tuple[BlacklistRule, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"egress mode {self.mode!r} is not one of {', '.join(MODES)}")

    def decide(self, url: str) -> Decision:
        if self.mode == "none":
            return Decision(False, "policy: none")
        if self.mode == "open":
            return Decision(True, None)
        parts = urlsplit(url)
        for rule in self.blacklist:
            if rule.matches(parts.hostname or "", parts.path):
                return Decision(False, rule.source)
        return Decision(True, None)

    def blocks_host(self, host: str) -> bool:
        """Whether some rule names or covers this host (`BlacklistRule.places`): raw (non-HTTP)
        tunnels to it are refused, since their paths cannot be seen."""
        name = _host(host)
        return self.mode == "none" or any(
            name == place for rule in self.blacklist for place, _ in rule.places
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "token": self.token,
            "blacklist": [r.source for r in self.blacklist],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> WorkspacePolicy:
        return cls(
            mode=str(data["mode"]),
            token=str(data["token"]),
            blacklist=tuple(BlacklistRule.parse(e) for e in data.get("blacklist", [])),
        )


def load_config(text: str) -> dict[str, WorkspacePolicy]:
    """The proxy's configuration file: {"workspaces": {name: policy}}."""
    data = json.loads(text)
    return {name: WorkspacePolicy.from_json(p) for name, p in data.get("workspaces", {}).items()}


def dump_config(policies: Mapping[str, WorkspacePolicy]) -> str:
    return json.dumps(
        {"workspaces": {name: p.to_json() for name, p in sorted(policies.items())}}, indent=1
    )


def event_line(
    at: str, workspace: str, method: str, url: str, decision: Decision, **extra: Any
) -> str:
    """One event of the proxy log (JSON line); `baseline.workspaces.egress` ingests these."""
    record = {
        "at": at,
        "workspace": workspace,
        "method": method,
        "url": url,
        "allowed": decision.allowed,
        "rule": decision.rule,
        **extra,
    }
    return json.dumps(record, sort_keys=True)
