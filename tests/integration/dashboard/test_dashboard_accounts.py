"""Accounts near their limit, needing a login, and spending budgets, on the page, end to end.

A real ``herdsman run`` runs the stand-in agent of the supervisor's account
tests (tests/integration/supervisor/spend_agent.py), which replays recorded
Claude Code streams chosen by account: a success that spent 3,338 budgeted
tokens and $0.022418, a rate-limit warning, and a CLI that is not logged in.
The page, opened before the runs, follows what they do to their accounts
from the event stream alone, and is audited by axe in those states.
"""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from browser_support import Herd, Watched, focused, log_in, logged_in_page, tab_to, violations
from playwright.sync_api import Browser, expect

AGENT = Path(__file__).parents[1] / "supervisor" / "spend_agent.py"
PHONE_WIDTH = 390


def accounts_config(directory: Path) -> str:
    """Two providers on spend_agent.py: ``agent`` for the states, ``spend`` for budgets."""
    records = directory / "records.jsonl"
    lines = []
    providers = {
        "agent": [("login", ""), ("near", 'window = "5h"'), ("spare", "")],
        "spend": [
            ("tok", 'window = "5h"\nbudget = 5000\nbudget_unit = "tokens"'),
            ("usd", 'window = "5h"\nbudget = 0.05\nbudget_unit = "usd"'),
        ],
    }
    for provider, accounts in providers.items():
        lines += [
            f"[providers.{provider}]",
            f'exec = ["{sys.executable}", "{AGENT}", "{records}"]',
            'protocol = "claude"',
            "concurrency = 1",
            'idle_timeout = "1h"',
        ]
        for name, settings in accounts:
            home = directory / "homes" / provider / name
            home.mkdir(parents=True)
            lines += [
                f"[[providers.{provider}.accounts]]",
                f'name = "{name}"',
                f'env = {{ CLAUDE_CONFIG_DIR = "{home}" }}',
                settings,
            ]
    return "\n" + "\n".join(lines) + "\n"


def replay(herd: Herd, provider: str, account: str, case: str | None) -> None:
    """Make ``account``'s runs replay the recorded ``case`` (None: the recorded success)."""
    chosen = herd.directory / "homes" / provider / account / "stream"
    if case is None:
        chosen.unlink(missing_ok=True)
    else:
        chosen.write_text(case)


@pytest.fixture(scope="module")
def herd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Herd]:
    directory = tmp_path_factory.mktemp("herd")
    herd = Herd(directory, extra=accounts_config(directory))
    yield herd
    herd.close()


@pytest.fixture
def watched(herd: Herd, browser: Browser) -> Iterator[Watched]:
    """A fresh logged-in page at 1280 px; the test fails if it logs an error."""
    with logged_in_page(herd, browser) as watched:
        yield watched


def finished(herd: Herd, run_id: str) -> dict[str, object]:
    run: dict[str, object] = herd.api.get(f"/v1/runs/{run_id}", params={"wait": 60}).json()
    return run


def audit_on_a_phone(herd: Herd, browser: Browser) -> None:
    """The accounts view on a phone: no sideways scroll of the page, no axe violation."""
    phone = browser.new_context(viewport={"width": PHONE_WIDTH, "height": 844}, is_mobile=True)
    try:
        small = phone.new_page()
        log_in(small, herd)
        small.goto(f"{herd.url}/#accounts")
        expect(small.locator('tr[data-account="agent/login"] .badge')).to_have_text("needs login")
        assert small.evaluate("document.documentElement.scrollWidth") <= PHONE_WIDTH
        assert violations(small) == Counter()
    finally:
        phone.close()


def test_a_near_limit_and_a_needed_login_follow_real_runs_until_logged_in_again(
    herd: Herd, watched: Watched, browser: Browser
) -> None:
    page = watched.page
    page.goto(f"{herd.url}/#accounts")
    page.evaluate("window.notReloaded = true")
    rows = {name: page.locator(f'tr[data-account="agent/{name}"]') for name in ("login", "near")}
    expect(rows["login"]).to_contain_text("available")
    expect(page.locator("#accounts .badge")).to_have_count(0)

    # login (first in the file) refuses the run's login; the run moves on to near,
    # whose stream warns that it nears its limit.
    replay(herd, "agent", "login", "claude-not-logged-in")
    replay(herd, "agent", "near", "claude-usage-warning")
    moved = herd.submit("moves", "c1", provider="agent")
    expect(rows["login"].locator(".badge")).to_have_text("needs login")
    expect(rows["login"]).to_contain_text("(authentication_failed): Not logged in")
    expect(rows["near"].locator(".badge")).to_have_text("near limit")
    expect(rows["near"]).to_contain_text("(near its limit until ")
    assert page.evaluate("window.notReloaded") is True
    run = finished(herd, moved)
    assert (run["status"], run["account"], run["attempts"]) == ("succeeded", "near", 2)
    replay(herd, "agent", "near", None)
    assert violations(page) == Counter()

    # The overview counts them; the moved run's page says where it went and why.
    page.locator('nav a[href="#overview"]').click()
    # Six accounts: gate's ambient one, agent's three, spend's two; login alone takes no runs.
    card = page.locator('[data-card="accounts"]')
    expect(card.locator("b")).to_have_text("5 / 6")
    expect(card.locator("span")).to_have_text("accounts available (1 needs login, 1 near limit)")
    page.locator('nav a[href="#runs"]').click()
    page.locator(f'#recent a[href="#log/{moved}"]').click()
    expect(page.locator('dd[data-fact="account"]')).to_have_text("near")
    expect(page.locator('dd[data-fact="attempts"]')).to_have_text("2")
    expect(page.locator('dd[data-fact="notes"]')).to_contain_text(
        "attempt 1 found account login not logged in"
    )

    # On a phone, in these states too.
    audit_on_a_phone(herd, browser)

    # Logged in again, said from the keyboard: the account takes runs again.
    replay(herd, "agent", "login", None)
    page.locator('nav a[href="#accounts"]').click()
    tab_to(page, "agent/login is logged in again")
    page.keyboard.press("Enter")
    expect(rows["login"].locator(".badge")).to_have_count(0)
    expect(rows["login"].locator("td").nth(4)).to_have_text("available")
    expect(page.locator("#announce")).to_have_text("agent/login takes runs again.")
    assert focused(page)["tag"] != "body"
    again = herd.submit("again", "c2", provider="agent")
    page.goto(f"{herd.url}/#log/{again}")
    expect(page.locator('dd[data-fact="status"]')).to_have_text("succeeded")
    expect(page.locator('dd[data-fact="account"]')).to_have_text("login")
    assert page.evaluate("window.notReloaded") is True


def test_budgets_in_tokens_and_dollars_read_as_herdsman_accounts_says_them(
    herd: Herd, watched: Watched
) -> None:
    page = watched.page
    page.goto(f"{herd.url}/#accounts")
    # One recorded success on each account: tok takes the first, usd (less used) the next.
    for prompt in ("tokens", "dollars"):
        run_id = herd.submit(prompt, prompt, provider="spend")
        assert finished(herd, run_id)["status"] == "succeeded"
    usage = {
        name: page.locator(f'tr[data-account="spend/{name}"] td').nth(3) for name in ("tok", "usd")
    }
    expect(usage["tok"]).to_have_text("3.3k tokens of 5.0k")
    expect(usage["usd"]).to_have_text("$0.02 of $0.05")
    # The same words as the CLI's.
    shown = subprocess.run(
        [sys.executable, "-m", "herdsman", "accounts", "-c", "supervisor.toml"],
        cwd=herd.directory,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    cli = {line.split()[1]: line for line in shown.splitlines()[1:] if line.strip()}
    for name, cell in usage.items():
        assert cell.inner_text() in cli[name]
    assert violations(page) == Counter()
