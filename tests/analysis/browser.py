"""Where the browser tests find Chromium, and what they do when it is missing."""

from __future__ import annotations

import os
import shutil

import pytest

CANDIDATES = ("/usr/bin/chromium", "/usr/bin/chromium-browser")


def require_chromium() -> str:
    """Chromium's path; fails when BASELINE_REQUIRE_SERVICES=1 and it is missing, else skips."""
    for candidate in (os.environ.get("BROWSER_PATH"), *CANDIDATES, shutil.which("chromium")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    message = "headless Chromium is not installed (scripts/services/40-chromium.sh installs it)"
    if os.environ.get("BASELINE_REQUIRE_SERVICES") == "1":
        pytest.fail(message)
    pytest.skip(message)
