"""Headless Chromium through Selenium for the portal's browser tests, with its console log."""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from flask import Flask
from werkzeug.serving import make_server

from tests.analysis.browser import require_chromium
from tests.conftest import PASSWORD


@contextmanager
def chromium(width: int = 1400, height: int = 1000) -> Iterator[Any]:
    """A headless Chromium WebDriver (browser console log enabled); fails when
    BASELINE_REQUIRE_SERVICES=1 and Chromium or chromedriver is missing, else skips."""
    browser = require_chromium()
    driver_path = os.environ.get("BASELINE_CHROMEDRIVER") or shutil.which("chromedriver")
    if not driver_path:
        if os.environ.get("BASELINE_REQUIRE_SERVICES") == "1":
            pytest.fail("chromedriver is not installed (scripts/services/40-chromium.sh)")
        pytest.skip("chromedriver is not installed")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="bl-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={profile}",
        f"--window-size={width},{height}",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(executable_path=driver_path))
    driver.set_page_load_timeout(120)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


# Chromium aborts requests in flight when the machine's interfaces change, and the tests' own
# Docker networks come and go meanwhile: that is the test machine, not the page.
HOST_NETWORK_NOISE = "net::ERR_NETWORK_CHANGED"


def console_errors(driver: Any) -> list[str]:
    """Severe console messages so far (CSP violations, script errors)."""
    return [
        e["message"]
        for e in driver.get_log("browser")
        if e.get("level") == "SEVERE" and HOST_NETWORK_NOISE not in e["message"]
    ]


def screenshot(driver: Any, name: str) -> None:
    """Keep a full-page screenshot under BASELINE_SCREENSHOTS (a CI artifact) when it is set."""
    folder = os.environ.get("BASELINE_SCREENSHOTS")
    if not folder:
        return
    os.makedirs(folder, exist_ok=True)
    height = driver.execute_script("return document.body.scrollHeight")
    driver.set_window_size(1400, max(1000, min(int(height), 6000)))
    driver.save_screenshot(os.path.join(folder, f"{name}.png"))


@contextmanager
def serving(app: Flask) -> Iterator[str]:
    """The portal `app` served on a free loopback port for a browser, in a thread; its URL."""
    server = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        thread.join(timeout=10)


def log_in(driver: Any, portal_url: str, email: str, password: str = PASSWORD) -> None:
    """Log in through the portal's login form, as a person does, and wait until it is left."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get(f"{portal_url}/login")
    driver.find_element(By.NAME, "email").send_keys(email)
    driver.find_element(By.NAME, "password").send_keys(password)
    driver.find_element(By.CSS_SELECTOR, "form button, form input[type=submit]").click()
    WebDriverWait(driver, 30).until(lambda d: "/login" not in d.current_url)


# The dialog JupyterLab opens over the launcher when one of its theme stylesheets did not load (a
# request through the hub's proxy and tunnel that failed on a loaded CI machine): a participant
# clicks it away and works on; the tests do as they would.
THEME_ERROR = "Error Loading Theme"
TERMINAL_CARD = "//div[contains(@class,'jp-LauncherCard') and .//*[normalize-space()='Terminal']]"


def open_lab_terminal(driver: Any, wait: Any) -> None:
    """Click JupyterLab's Terminal launcher card (the driver in JupyterLab's frame), first
    dismissing a theme-loading error dialog that covers it; any other dialog fails the test."""
    from selenium.common.exceptions import ElementClickInterceptedException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec

    card = (By.XPATH, TERMINAL_CARD)
    for _ in range(3):
        wait.until(ec.element_to_be_clickable(card))
        try:
            driver.find_element(*card).click()
            return
        except ElementClickInterceptedException:
            dialogs = driver.find_elements(By.CSS_SELECTOR, "dialog.jp-Dialog")
            labels = [dialog.get_attribute("aria-label") or "" for dialog in dialogs]
            if not dialogs or not all(label.startswith(THEME_ERROR) for label in labels):
                raise
            for dialog in dialogs:
                dialog.find_element(By.CSS_SELECTOR, ".jp-Dialog-button.jp-mod-accept").click()
    raise AssertionError("JupyterLab's Terminal card stayed covered by theme error dialogs")
