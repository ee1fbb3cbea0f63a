"""One Chromium kept per process for static figure exports (PNG, SVG).

Why: kaleido starts a browser for each export when none is kept (about 3.5 s on these machines,
against about 0.2 s through a kept one), and every figure download of the portal and every
figure of an exported report paid it. kaleido's own kept server (`kaleido.start_sync_server`)
is not used: its callers share one answer queue, so two threads exporting at once could get
each other's image, and a browser that fails to start leaves its callers waiting forever. Here
exports are taken one at a time, each with a time limit, and any failure closes the browser, so
the next export starts a fresh one (what every export did before).

kaleido 1.x reads its tab's JavaScript context before the tab's navigation may have committed;
on a loaded machine it then evaluates in the blank page ("kaleido_scopes is not defined").
kaleido reloads a tab after every render, and a reload reports the page's own context, so that
failure is tried again on the same browser (a fresh browser would race again at its start).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import logging
import os
import threading
import time
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")
log = logging.getLogger(__name__)

START_TIMEOUT_S = 60.0
RENDER_TIMEOUT_S = 120.0
CLOSE_TIMEOUT_S = 10.0
PAGE_NOT_LOADED = "is not defined"
PAGE_RACE_TRIES = 6
PAGE_RACE_PAUSE_S = 0.25


class ExportBrowser:
    """A kaleido browser on an event loop of its own thread, opened at the first export."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._kaleido: Any = None
        self._browser = ""

    @property
    def is_open(self) -> bool:
        return self._kaleido is not None

    def render(
        self, browser: str, figure: dict[str, Any], fmt: str, width: int, height: int
    ) -> bytes:
        """The figure as `fmt` ("png" or "svg") bytes, drawn by the Chromium at `browser`;
        raises what kaleido raised (the browser is closed then) or TimeoutError.

        A kept browser that fails (it may have died since the last export) is replaced and the
        export tried once more; a fresh browser's failure is the export's."""
        with self._lock:
            if self._kaleido is not None and browser != self._browser:
                self._close()  # another Chromium was asked for
            if self._kaleido is not None:
                try:
                    return self._render(figure, fmt, width, height)
                except Exception:
                    self._close()
            self._open(browser)
            try:
                return self._render(figure, fmt, width, height)
            except BaseException:
                self._close()
                raise

    def close(self) -> None:
        with self._lock:
            self._close()

    def forget(self) -> None:
        """In a forked child: the browser and its thread are the parent's."""
        self._lock = threading.Lock()
        self._loop = self._thread = self._kaleido = None

    def _render(self, figure: dict[str, Any], fmt: str, width: int, height: int) -> bytes:
        """One export, tried again while it met a tab whose page had not loaded."""
        for attempt in range(1, PAGE_RACE_TRIES):
            try:
                return self._render_once(figure, fmt, width, height)
            except Exception as exc:
                if PAGE_NOT_LOADED not in str(exc):
                    raise
                log.info("figure export met a page that had not loaded; trying again")
                time.sleep(PAGE_RACE_PAUSE_S * attempt)
        return self._render_once(figure, fmt, width, height)

    def _render_once(self, figure: dict[str, Any], fmt: str, width: int, height: int) -> bytes:
        opts = {"format": fmt, "width": width, "height": height}
        image = self._run(self._kaleido.calc_fig(figure, opts=opts), RENDER_TIMEOUT_S)
        if not isinstance(image, bytes):
            raise RuntimeError(f"the browser gave {type(image).__name__}, not an image")
        return image

    def _open(self, browser: str) -> None:
        loop = asyncio.new_event_loop()
        loop.set_exception_handler(_log_quietly)
        thread = threading.Thread(target=loop.run_forever, name="figure-export", daemon=True)
        thread.start()
        self._loop, self._thread = loop, thread
        try:
            self._kaleido = self._run(_start_kaleido(browser), START_TIMEOUT_S)
        except BaseException:
            self._close()
            raise
        self._browser = browser

    def _run(self, coroutine: Coroutine[Any, Any, T], timeout_s: float) -> T:
        assert self._loop is not None
        future = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        try:
            return future.result(timeout_s)
        except TimeoutError:
            future.cancel()
            raise TimeoutError(f"the browser did not answer within {timeout_s:.0f} s") from None

    def _close(self) -> None:
        loop, thread, kaleido = self._loop, self._thread, self._kaleido
        self._loop = self._thread = self._kaleido = None
        if loop is None:
            return
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(_shut_down(kaleido), loop).result(CLOSE_TIMEOUT_S)
        loop.call_soon_threadsafe(loop.stop)
        if thread is not None:
            thread.join(CLOSE_TIMEOUT_S)
        if not loop.is_running():
            loop.close()


async def _shut_down(kaleido: Any) -> None:
    """Close the browser, then end what the driver still runs (its watchdog, a render of a
    browser that died), so that nothing is left pending when the loop stops."""
    try:
        if kaleido is not None:
            await kaleido.close()
    finally:
        rest = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
        for task in rest:
            task.cancel()
        await asyncio.gather(*rest, return_exceptions=True)


def _log_quietly(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """The driver's leftovers after a browser died ("Task exception was never retrieved") are
    one warning line: the export that met them has already failed (and was tried again), and a
    traceback in the portal's log would send an operator hunting for a failure."""
    failure = context.get("exception")
    detail = f": {type(failure).__name__}: {failure}" if failure is not None else ""
    log.warning("figure export browser: %s%s", context.get("message", "event loop error"), detail)


async def _start_kaleido(browser: str) -> Any:
    """Made on the browser's own loop: kaleido binds its queues to the loop it starts on."""
    import kaleido

    instance = kaleido.Kaleido(path=browser)
    await instance.open()
    return instance


EXPORT_BROWSER = ExportBrowser()
atexit.register(EXPORT_BROWSER.close)
os.register_at_fork(after_in_child=EXPORT_BROWSER.forget)
