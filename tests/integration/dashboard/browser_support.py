"""What the dashboard's browser tests share: a real ``herdsman run``, chromium, a watched page."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from axe_playwright_python.sync_playwright import Axe
from dashboard_support import write_config
from playwright.sync_api import Browser, ConsoleMessage, Page, expect, sync_playwright


class Herd:
    """A ``herdsman run`` child process, an API client for it, and its directory."""

    def __init__(self, directory: Path, *, extra: str = "") -> None:
        self.directory = directory
        self.config = write_config(directory, extra=extra)
        self._log = (directory / "supervisor.log").open("w")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "herdsman", "run", "-c", "supervisor.toml"],
            cwd=directory,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 30
        while "herdsman is running; API on " not in (output := self.output()):
            assert self.process.poll() is None, output
            assert time.monotonic() < deadline, output
            time.sleep(0.05)
        self.url = output.split("herdsman is running; API on ")[1].split(";")[0]
        self.token = (directory / "state" / "api-token").read_text().strip()
        self.api = httpx.Client(
            base_url=self.url, headers={"Authorization": f"Bearer {self.token}"}, timeout=30
        )

    def output(self) -> str:
        return (self.directory / "supervisor.log").read_text()

    def submit(self, prompt: str, conversation: str | None, provider: str = "gate") -> str:
        body = {"provider": provider, "prompt": prompt, "conversation": conversation}
        answer = self.api.post("/v1/runs", json=body)
        assert answer.status_code == 201, answer.text
        run_id: str = answer.json()["id"]
        return run_id

    def close(self) -> None:
        self.api.close()
        self.process.terminate()  # drains for the second of grace, then stops what runs
        try:
            self.process.wait(30)
        finally:
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait()
            self._log.close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """Debian's chromium, driven by Playwright, for the whole test module."""
    chromium = shutil.which("chromium")
    assert chromium is not None, "install Debian's chromium package (apt-get install chromium)"
    with sync_playwright() as playwright:
        # --no-sandbox: the tests may run as root, where chromium's sandbox will not start.
        browser = playwright.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        yield browser
        browser.close()


class Watched:
    """A page, and what it logged as errors."""

    def __init__(self, page: Page) -> None:
        self.page = page
        self.errors: list[str] = []
        page.on("console", self._console)
        page.on("pageerror", lambda exc: self.errors.append(f"uncaught: {exc}"))

    def _console(self, message: ConsoleMessage) -> None:
        if message.type == "error":
            self.errors.append(message.text)


def log_in(page: Page, herd: Herd) -> None:
    """Log ``page`` in through the form, and wait until it follows the live stream."""
    page.goto(herd.url)
    page.get_by_label("API token").fill(herd.token)
    page.get_by_role("button", name="Log in").click()
    expect(page.locator("#live")).to_have_text("live")


@contextmanager
def logged_in_page(herd: Herd, browser: Browser) -> Iterator[Watched]:
    """A fresh logged-in page at 1280 px; the block fails if the page logged an error."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    watched = Watched(context.new_page())
    log_in(watched.page, herd)
    try:
        yield watched
    finally:
        context.close()
    assert watched.errors == []


AXE = Axe()


def violations(page: Page) -> Counter[str]:
    """axe-core's violations on the page as shown, as the number of elements by rule.

    Its default rules, and WCAG 2.2's target size (24 px, or spaced apart), which
    axe leaves off by default: a phone's finger needs it.
    """
    options = {"resultTypes": ["violations"], "rules": {"target-size": {"enabled": True}}}
    results = AXE.run(page, options=options)
    found: Counter[str] = Counter()
    for violation in results.response["violations"]:
        found[violation["id"]] += len(violation["nodes"])
    assert not found, f"{dict(found)}\n{results.generate_report()}"
    return found


def focused(page: Page) -> dict[str, Any]:
    """What has the focus: its tag, accessible name's parts, and whether it is marked."""
    found: dict[str, Any] = page.evaluate(
        """() => {
          const e = document.activeElement;
          const style = getComputedStyle(e);
          return {
            tag: e.tagName.toLowerCase(),
            label: e.getAttribute("aria-label") || e.textContent.trim().slice(0, 60),
            href: e.getAttribute("href"),
            outline: style.outlineStyle !== "none" && parseFloat(style.outlineWidth) >= 2,
          };
        }"""
    )
    return found


def tab_to(page: Page, label: str, *, key: str = "Tab", limit: int = 80) -> list[dict[str, Any]]:
    """Press ``key`` until the control named ``label`` has the focus; the stops on the way."""
    stops = []
    for _ in range(limit):
        page.keyboard.press(key)
        stop = focused(page)
        stops.append(stop)
        assert stop["tag"] != "body", f"the focus fell out of the page before {label!r}: {stops}"
        assert stop["outline"], f"no visible focus on {stop}"
        if stop["label"] == label:
            return stops
    raise AssertionError(f"{label!r} was not reached in {limit} presses of Tab: {stops}")
