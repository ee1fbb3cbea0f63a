"""`baseline demo` on a fresh BASELINE_HOME: every link reachable from the navigation answers 200
for the role that sees it, every form control on those pages has a label, and the demo's log has
no traceback.

The demo runs as a subprocess, exactly as `make demo` starts it (scheduler included). Each role
logs in through the real form and follows every same-origin GET link on every page it reaches.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import urljoin, urlparse

import pytest
import requests

from tests.docker_env import new_deployment, remove_deployment
from tests.ports import free_port

ROLES = ("admin", "coordinator", "grader", "analyst", "participant")
MAX_PAGES_PER_ROLE = 5000  # a safety net; the per-shape cap below keeps the crawl short
# Links of one shape (the path with ids as N, the query's names) are followed this many times:
# every kind of page is visited on many rows, without fetching all thousands of file views.
PER_SHAPE = 30
# A figure download (PNG/SVG) starts a Chromium through kaleido, seconds each: the crawl followed
# one per figure, format and dashboard filter set in every role (most of its time). Now each
# figure is exported once in each format over the whole crawl, and every role that sees the
# downloads exports at least one figure in each format. The figures for every filter set are
# drawn by the dashboard pages, which are all crawled, with the code the download route uses
# (report.figures); tests/analysis/test_plots.py checks what an export contains.
IMAGE_SUFFIXES = (".png", ".svg")
REPO = Path(__file__).resolve().parent.parent
# Inputs a button or nothing shows: they need no label.
UNNAMED_INPUTS = ("hidden", "submit", "button", "image", "reset")


class _Page(HTMLParser):
    """A page's links, and its form controls that nothing names (no `<label for>`, no enclosing
    `<label>`, no aria-label or title): a screen reader reads those out as a bare "edit text"."""

    def __init__(self) -> None:
        super().__init__()
        self.links: list[str] = []
        self._labelled_ids: set[str] = set()
        self._label_depth = 0
        # tag, name, id, and whether an enclosing label or an attribute names it
        self._controls: list[tuple[str, str | None, str | None, bool]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        named = dict(attrs)
        if tag == "a" and named.get("href"):
            self.links.append(str(named["href"]))
        elif tag == "label":
            self._label_depth += 1
            if named.get("for"):
                self._labelled_ids.add(str(named["for"]))
        elif tag in ("input", "select", "textarea") and named.get("type") not in UNNAMED_INPUTS:
            otherwise = self._label_depth > 0 or any(
                named.get(a) for a in ("aria-label", "aria-labelledby", "title")
            )
            self._controls.append((tag, named.get("name"), named.get("id"), otherwise))

    def handle_endtag(self, tag: str) -> None:
        if tag == "label":
            self._label_depth = max(0, self._label_depth - 1)

    def unlabelled(self) -> list[str]:
        """`<tag name=...>` of every form control nothing names."""
        return [
            f"<{tag} name={name or id_}>"
            for tag, name, id_, otherwise in self._controls
            if not otherwise and (id_ is None or id_ not in self._labelled_ids)
        ]


@pytest.fixture(scope="module")
def demo(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[str, dict[str, tuple[str, str]], Path]]:
    home = tmp_path_factory.mktemp("demo-home")
    log_path = home / "demo.log"
    port = free_port()
    # Its own deployment: the workspaces it leaves live when stopped are removed below.
    deployment = new_deployment("demo-crawl")
    env = {
        **os.environ,
        "BASELINE_HOME": str(home),
        "PYTHONPATH": str(REPO),
        "BASELINE_DEPLOYMENT": deployment,
    }
    env.pop("BASELINE_DATABASE_URL", None)
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "baseline", "demo", "--port", str(port)],
            cwd=REPO,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            assert process.poll() is None, log_path.read_text()[-4000:]
            try:
                if requests.get(f"{base}/api/v1/health", timeout=5).status_code == 200:
                    break
            except requests.ConnectionError:
                pass
            time.sleep(2)
        else:
            pytest.fail("the demo did not come up in 10 minutes:\n" + log_path.read_text()[-4000:])
        credentials = {
            role: (email, password)
            for role, email, password in re.findall(
                r"^\s+(\w+)\s+(\S+@\S+)\s+password: (\S+)$", log_path.read_text(), re.MULTILINE
            )
        }
        assert set(credentials) == set(ROLES), log_path.read_text()[:2000]
        yield base, credentials, log_path
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=30)
        remove_deployment(deployment)


def _login(base: str, email: str, password: str) -> requests.Session:
    http = requests.Session()
    page = http.get(f"{base}/login", timeout=60).text
    token = re.search(r'name="csrf_token" value="([^"]+)"', page)
    assert token
    response = http.post(
        f"{base}/login",
        data={"email": email, "password": password, "csrf_token": token.group(1)},
        allow_redirects=False,
        timeout=60,
    )
    assert response.status_code == 302, response.text[:500]
    return http


def _shape(target: str) -> str:
    url = urlparse(target)
    names = sorted({part.split("=", 1)[0] for part in url.query.split("&") if part})
    return re.sub(r"\d+", "N", url.path) + "?" + "&".join(names)


def _crawl(
    base: str, http: requests.Session, exported: set[str]
) -> tuple[dict[str, int], list[str]]:
    """Breadth-first over same-origin links from the home page; returns status per URL.
    `exported` holds the figure downloads (path shapes) followed so far, in any role."""
    seen: dict[str, int] = {}
    formats: set[str] = set()  # the figure formats this role has downloaded
    queue = ["/"]
    shapes: Counter[str] = Counter()
    failures: list[str] = []
    while queue and len(seen) < MAX_PAGES_PER_ROLE:
        path = queue.pop(0)
        if path in seen:
            continue
        response = http.get(base + path, timeout=120)
        seen[path] = response.status_code
        if response.status_code != 200:
            message = re.search(r"<main>.*?<p>([^<]*)</p>", response.text, re.DOTALL)
            failures.append(
                f"{path}: {response.status_code} {message.group(1) if message else ''}".strip()
            )
            continue
        if "text/html" not in response.headers.get("Content-Type", ""):
            continue
        parser = _Page()
        parser.feed(response.text)
        failures += [f"{path}: {control} has no label" for control in parser.unlabelled()]
        for href in parser.links:
            url = urlparse(urljoin(base + path, href))
            if url.netloc != urlparse(base).netloc or url.scheme not in ("http", "https"):
                continue
            target = url.path + (f"?{url.query}" if url.query else "")
            if url.path.endswith(IMAGE_SUFFIXES):
                image, suffix = re.sub(r"\d+", "N", url.path), Path(url.path).suffix
                if (image in exported and suffix in formats) or target in queue:
                    continue
                exported.add(image)
                formats.add(suffix)
                queue.append(target)
                continue
            if target in seen or target in queue or shapes[_shape(target)] >= PER_SHAPE:
                continue
            shapes[_shape(target)] += 1
            queue.append(target)
    return seen, failures


@pytest.mark.timeout(1800)
def test_every_link_answers_200_for_every_role_and_the_log_is_clean(
    demo: tuple[str, dict[str, tuple[str, str]], Path],
) -> None:
    base, credentials, log_path = demo
    report: dict[str, int] = {}
    failures: list[str] = []
    exported: set[str] = set()
    for role in ROLES:
        email, password = credentials[role]
        seen, failed = _crawl(base, _login(base, email, password), exported)
        report[role] = len(seen)
        failures += [f"{role}: {f}" for f in failed]
    assert failures == [], "\n".join(failures[:40])
    # Enough of the portal was reached to mean something (the studies, attempts, grading...).
    assert report["coordinator"] > 50 and report["grader"] > 20 and report["analyst"] > 3, report
    assert exported, "no figure download was reached"
    log = log_path.read_text()
    assert "Traceback" not in log, log[log.index("Traceback") - 500 :][:4000]
    assert "Running job" not in log  # APScheduler is quiet by default
