"""How every secret the portal hands out is stored: only its sha256, so a leaked database grants
no access (API tokens, invitation links, browser sessions, hub login tokens)."""

from __future__ import annotations

import hashlib


def hash_secret(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()
