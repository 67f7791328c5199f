"""Take the screenshots of docs/dashboard.md: a real supervisor, a few runs, chromium.

Starts ``herdsman run`` in a temporary folder with the demo agent (providers
whose runs succeed quickly, take long or fail, two accounts with budgets;
and one whose runs replay recorded Claude Code streams by account, so one
account needs a login and the other is warned near its limit),
submits runs so that some ended, some run and some wait, and saves each view
at 1280 px wide, the overview at a phone's width, and the sample day's
replay as ``herdsman sim view`` draws it, into this folder.
Needs the test extras (Playwright) and Debian's chromium.

Run: python docs/images/dashboard_screenshots.py
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from playwright.sync_api import Page, sync_playwright

from herdsman.runtime.dashboard.trace_view import view_html

HERE = Path(__file__).parent
#: The supervisor tests' stand-in for Claude Code: it replays a recorded stream
#: named by the file ``stream`` in the account's CLAUDE_CONFIG_DIR.
REPLAY_AGENT = HERE.parents[1] / "tests" / "integration" / "supervisor" / "spend_agent.py"
#: The ``review`` provider's accounts: the stream each replays, its budget.
REVIEW_ACCOUNTS = {
    "team": ("claude-not-logged-in", 'window = "5h"\nbudget = 50000\nbudget_unit = "tokens"'),
    "solo": ("claude-usage-warning", 'window = "5h"\nbudget = 1.00\nbudget_unit = "usd"'),
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def review_accounts(directory: Path) -> str:
    """The ``review`` provider's accounts, each home told which recorded stream to replay."""
    lines = []
    for name, (stream, budget) in REVIEW_ACCOUNTS.items():
        home = directory / "homes" / name
        home.mkdir(parents=True, exist_ok=True)
        (home / "stream").write_text(stream)
        lines += [
            "[[providers.review.accounts]]",
            f'name = "{name}"',
            f'env = {{ CLAUDE_CONFIG_DIR = "{home}" }}',
            budget,
        ]
    return "\n".join(lines)


def config(port: int, directory: Path) -> str:
    agent = [sys.executable, "-m", "herdsman.demo_agent", "--protocol", "claude"]
    replay = [sys.executable, str(REPLAY_AGENT), str(directory / "replayed.jsonl")]
    return f"""\
[supervisor]
state_dir = "state"
max_concurrency = 3
shutdown_grace = "1s"

[providers.claude]
exec = {[*agent, "--delay", "40"]!r}
concurrency = 2
protocol = "claude"

[[providers.claude.accounts]]
name = "work"
window = "5h"
budget = 5

[[providers.claude.accounts]]
name = "personal"
window = "5h"
budget = 20

[providers.codex]
exec = {[*agent, "--delay", "3", "--fail"]!r}
concurrency = 1
protocol = "claude"

[providers.local]
exec = {[*agent, "--delay", "1"]!r}
concurrency = 1
protocol = "claude"

[providers.review]
exec = {replay!r}
concurrency = 1
protocol = "claude"

{review_accounts(directory)}

[api]
listen = "127.0.0.1:{port}"
""".replace("'", '"')


def shoot(page: Page, url: str, view: str, name: str) -> None:
    page.goto(f"{url}/#{view}")
    page.wait_for_timeout(1500)
    page.screenshot(path=str(HERE / name), full_page=True)


def take_screenshots(directory: Path, url: str, token: str, port: int) -> None:
    """Submit the runs, break the file, and save each view."""
    api = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"})
    prompts = [
        ("local", "changelog", "Summarise yesterday's merges"),
        ("local", "changelog", "Link each entry to its pull request"),
        ("local", "typos", "Fix the typos in docs/"),
        ("codex", "review", "Review the retry logic in the ledger"),
        ("codex", "flaky-test", "Find why test_sweep is flaky"),
        ("claude", "onboarding", "Write the onboarding guide's first section"),
        ("claude", "release-notes", "Draft the release notes for 0.4"),
        ("claude", "onboarding", "Add a section on running the tests"),
        ("claude", "bug-1432", "Fix the off-by-one in the pager"),
        ("claude", "onboarding", "Proofread the whole guide"),
        # team refuses its login; the run moves to solo, which is warned near its limit.
        ("review", "security", "Review the token handling"),
    ]
    for provider, conversation, prompt in prompts:
        body = {"provider": provider, "prompt": prompt, "conversation": conversation}
        api.post("/v1/runs", json=body).raise_for_status()
    time.sleep(8)  # the codex runs fail, the claude runs are under way
    (directory / "supervisor.toml").write_text(
        config(port, directory).replace("concurrency = 1", "concurrency = 0"), encoding="utf-8"
    )
    time.sleep(2)  # the file watcher rejects it
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=shutil.which("chromium"), args=["--no-sandbox"]
        )
        page = browser.new_page(viewport={"width": 1280, "height": 800})
        page.goto(url)
        page.screenshot(path=str(HERE / "dashboard-login.png"))
        page.get_by_label("API token").fill(token)
        page.get_by_role("button", name="Log in").click()
        page.wait_for_selector("#live.on")
        shoot(page, url, "overview", "dashboard-overview.png")
        shoot(page, url, "runs", "dashboard-runs.png")
        shoot(page, url, "accounts", "dashboard-accounts.png")
        shoot(page, url, "config", "dashboard-config.png")
        page.goto(f"{url}/#timeline")
        page.select_option("#hours", "1")
        page.select_option("#lanes", "conversation")
        shoot(page, url, "timeline", "dashboard-timeline.png")
        run_id = api.get("/v1/runs", params={"provider": "codex"}).json()["runs"][0]["id"]
        shoot(page, url, f"log/{run_id}", "dashboard-log.png")
        phone = browser.new_page(viewport={"width": 390, "height": 844})
        phone.context.add_cookies(page.context.cookies())
        shoot(phone, url, "overview", "dashboard-phone.png")
        # The sample day's replay, as `herdsman sim view` draws it.
        day = directory / "day.html"
        golden = HERE.parent.parent / "sim" / "team-day.golden.jsonl"
        day.write_text(view_html(golden), encoding="utf-8")
        page.goto(day.as_uri())
        page.wait_for_timeout(500)
        page.screenshot(path=str(HERE / "dashboard-trace.png"), full_page=True)
        browser.close()
    api.close()


def main() -> None:
    with tempfile.TemporaryDirectory() as folder:
        directory = Path(folder)
        port = free_port()
        (directory / "supervisor.toml").write_text(config(port, directory), encoding="utf-8")
        with (directory / "supervisor.log").open("w") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "herdsman", "run", "-c", "supervisor.toml"],
                cwd=directory,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        try:
            while "herdsman is running" not in (directory / "supervisor.log").read_text():
                assert process.poll() is None, (directory / "supervisor.log").read_text()
                time.sleep(0.1)
            url = f"http://127.0.0.1:{port}"
            token = (directory / "state" / "api-token").read_text().strip()
            take_screenshots(directory, url, token, port)
        finally:
            process.terminate()
            process.wait(30)


if __name__ == "__main__":
    main()
