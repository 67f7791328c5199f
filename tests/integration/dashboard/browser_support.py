"""What the dashboard's browser tests share: a real ``herdsman run``, chromium, a watched page."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from dashboard_support import write_config
from playwright.sync_api import Browser, ConsoleMessage, Page, sync_playwright


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
