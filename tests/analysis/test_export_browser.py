"""The kept export browser: one Chromium for many exports, safe from several threads, and a
browser that died is replaced."""

from __future__ import annotations

import os
import signal
import struct
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import plotly.graph_objects as go
import pytest

from analysis import report
from analysis.export_browser import ExportBrowser
from tests.analysis.browser import require_chromium

pytestmark = pytest.mark.browser


@pytest.fixture
def counted_browser(tmp_path: Path) -> tuple[str, Path]:
    """Chromium behind a script that notes each start and the browser's pid."""
    starts = tmp_path / "starts"
    script = tmp_path / "chromium"
    script.write_text(f'#!/bin/sh\necho $$ >> {starts}\nexec {require_chromium()} "$@"\n')
    script.chmod(0o755)
    return str(script), starts


@pytest.fixture
def browser() -> Iterator[ExportBrowser]:
    kept = ExportBrowser()
    yield kept
    kept.close()


def png_size(image: bytes) -> tuple[int, int]:
    assert image[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", image[16:24])
    return width, height


def figure(points: int) -> dict[str, object]:
    return go.Figure(go.Scatter(x=list(range(points)), y=list(range(points)))).to_dict()


def test_exports_share_one_browser_and_threads_get_their_own_images(
    browser: ExportBrowser, counted_browser: tuple[str, Path]
) -> None:
    path, starts = counted_browser
    assert png_size(browser.render(path, figure(3), "png", 300, 200)) == (300, 200)
    assert b"<svg" in browser.render(path, figure(4), "svg", 300, 200)[:200]
    sizes = [(320 + 10 * i, 240 + 10 * i) for i in range(6)]
    with ThreadPoolExecutor(max_workers=6) as pool:
        images = list(pool.map(lambda s: browser.render(path, figure(5), "png", *s), sizes))
    assert [png_size(image) for image in images] == sizes  # nobody got another's image
    assert len(starts.read_text().split()) == 1  # eight exports, one browser
    browser.close()
    assert not browser.is_open


def test_a_tab_that_evaluates_before_its_page_loaded_is_tried_again_in_the_same_browser(
    browser: ExportBrowser, counted_browser: tuple[str, Path]
) -> None:
    """kaleido's start-up race, made to happen: each waiting tab is pointed at a JavaScript
    context without kaleido's script (an isolated world of the page), as a tab that read its
    context before its navigation committed is. The export succeeds on the same browser."""
    path, starts = counted_browser
    browser.render(path, figure(3), "png", 300, 200)

    async def point_tabs_at_a_context_without_kaleido() -> int:
        tabs = list(browser._kaleido.tabs_ready._queue)  # the tabs waiting for an export
        for waiting in tabs:
            frames = await waiting.tab.send_command("Page.getFrameTree")
            world = await waiting.tab.send_command(
                "Page.createIsolatedWorld",
                params={"frameId": frames["result"]["frameTree"]["frame"]["id"]},
            )
            waiting._current_js_id = world["result"]["executionContextId"]
        return len(tabs)

    assert browser._run(point_tabs_at_a_context_without_kaleido(), 30) >= 1
    assert png_size(browser.render(path, figure(4), "png", 310, 210)) == (310, 210)
    assert len(starts.read_text().split()) == 1


def test_a_browser_that_died_is_replaced_at_the_next_export(
    browser: ExportBrowser, counted_browser: tuple[str, Path]
) -> None:
    path, starts = counted_browser
    browser.render(path, figure(3), "png", 300, 200)
    os.kill(int(starts.read_text().split()[0]), signal.SIGKILL)
    assert png_size(browser.render(path, figure(3), "png", 300, 200)) == (300, 200)
    assert len(starts.read_text().split()) == 2


def test_a_browser_that_cannot_start_is_a_clear_error_and_nothing_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    broken = tmp_path / "chromium"
    broken.write_text("#!/bin/sh\nexit 3\n")
    broken.chmod(0o755)
    monkeypatch.setenv("BROWSER_PATH", str(broken))
    with pytest.raises(RuntimeError) as failure:
        report.write_figure(go.Figure(), tmp_path / "f.png")
    message = str(failure.value)
    assert message.startswith(f"static export through {broken} failed: The browser")
    assert "\n" not in message and "('" not in message  # one sentence, not the error's tuple
    assert not report.EXPORT_BROWSER.is_open
    assert not (tmp_path / "f.png").exists()
