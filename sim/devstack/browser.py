"""A headless Chromium that opens the Prefect UI as an operator's browser does:
Debian's `chromium` (scripts/bootstrap.sh installs it), driven over the DevTools
protocol by Playwright's Python package.

Playwright cannot download its own browser build here (no network but the
package registries), so it launches the system's: `executable_path` names it.
Used by the UI tests (tests/e2e/test_ui.py) and the documentation's screenshots
(scripts/ui-screenshots.sh).

A server with an auth string (every one devstack starts: issue 30) answers every page
with a login form first; `log_in` fills it as a person does. Both of Prefect's UIs (the
classic one under `/`, the new one under `/v2`) keep what was entered in the browser's
storage for the server's address, so a browser context logs in once.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from playwright.sync_api import Browser, BrowserContext, Page, sync_playwright

__all__ = ["CHROMIUM", "LOGIN_PLACEHOLDER", "VIEWPORT", "chromium_executable", "headless_chromium", "log_in",
           "new_context"]  # fmt: skip

#: Debian's wrapper script; `PATH` is searched when it is not there.
CHROMIUM = "/usr/bin/chromium"
#: The window the pages are drawn in, and the documentation's screenshots' size.
VIEWPORT = {"width": 1400, "height": 900}
#: What the login form's one field shows before anything is typed (Prefect 3.9, both UIs).
LOGIN_PLACEHOLDER = "admin:pass"


def chromium_executable() -> str | None:
    """Debian's chromium, or the first `chromium` / `chromium-browser` on PATH; None when there is none."""
    if Path(CHROMIUM).exists():
        return CHROMIUM
    return shutil.which("chromium") or shutil.which("chromium-browser")


@contextmanager
def headless_chromium() -> Iterator[Browser]:
    """The system's Chromium, headless, stopped on exit.

    `--no-sandbox`: the tests run as root, where Chromium's sandbox refuses to
    start. `--disable-dev-shm-usage`: /dev/shm may be small in containers.
    """
    executable = chromium_executable()
    if executable is None:
        raise RuntimeError("chromium is not installed: apt-get install chromium (scripts/bootstrap.sh does)")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=executable,
            headless=True,
            args=["--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"],
        )
        try:
            yield browser
        finally:
            browser.close()


def new_context(browser: Browser, *, timeout: float) -> BrowserContext:
    """A browser context (its own cookies and cache: a first visit, where the address
    leads a newcomer) whose pages wait up to `timeout` seconds for what they are asked to."""
    context = browser.new_context(viewport={"width": VIEWPORT["width"], "height": VIEWPORT["height"]})
    context.set_default_timeout(timeout * 1000)
    context.set_default_navigation_timeout(timeout * 1000)
    return context


def log_in(page: Page, auth_string: str) -> None:
    """On the login form the UI shows (any page of a server that asks for an auth string): type the
    string, press Login, and return once the UI has left the form for the page it was asked for.
    The page's default timeout bounds each wait."""
    field = page.get_by_placeholder(LOGIN_PLACEHOLDER)
    field.fill(auth_string)
    page.get_by_role("button", name="Login").click()
    field.wait_for(state="detached")
