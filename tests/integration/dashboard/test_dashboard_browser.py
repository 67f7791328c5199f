"""The dashboard in a real browser (Debian's chromium, driven by Playwright).

One supervisor (a real ``herdsman run``) and one browser serve the whole
module; each test works on runs of its own and checks that the page logged
no error while it ran.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from browser_support import Herd, Watched, logged_in_page
from dashboard_support import open_gate
from playwright.sync_api import Browser, Page, expect

BROKEN = '[supervisor]\nstate_dir = "state"\n[providers.gate]\nexec = ["x"]\nconcurrency = "many"\n'


@pytest.fixture(scope="module")
def herd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Herd]:
    herd = Herd(tmp_path_factory.mktemp("herd"))
    yield herd
    herd.close()


@pytest.fixture(scope="module")
def logged_in(herd: Herd, browser: Browser) -> Iterator[Watched]:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    watched = Watched(context.new_page())
    page = watched.page
    page.goto(herd.url)
    page.get_by_label("API token").fill(herd.token)
    page.get_by_role("button", name="Log in").click()
    expect(page.locator("#live")).to_have_text("live")
    assert herd.token not in page.url
    yield watched
    context.close()


@pytest.fixture
def page(logged_in: Watched) -> Iterator[Page]:
    """The logged-in page; the test fails if the page logs an error meanwhile."""
    logged_in.errors.clear()
    yield logged_in.page
    assert logged_in.errors == []


def test_runs_move_from_queued_to_running_to_succeeded_without_a_reload(
    herd: Herd, page: Page
) -> None:
    page.goto(f"{herd.url}/#overview")
    page.evaluate("window.notReloaded = true")
    first = herd.submit("q1", "queue")
    second = herd.submit("q2", "queue")
    running, queued = page.locator("#running"), page.locator("#queued")
    expect(running.locator(f'tr[data-run="{first}"]')).to_be_visible()
    waiting = queued.locator(f'tr[data-run="{second}"]')
    expect(waiting).to_contain_text("queue")
    expect(waiting.locator(f'td.behind a[href="#log/{first}"]')).to_have_count(1)
    open_gate(herd.directory, "q1")
    expect(running.locator(f'tr[data-run="{second}"]')).to_be_visible()
    expect(queued.locator(f'tr[data-run="{second}"]')).to_have_count(0)
    open_gate(herd.directory, "q2")
    expect(running.locator(f'tr[data-run="{second}"]')).to_have_count(0)
    # The runs view, reached from the keyboard.
    page.locator('nav a[href="#runs"]').focus()
    page.keyboard.press("Enter")
    row = page.locator(f'#recent tr[data-run="{second}"]')
    expect(row.locator(".status")).to_have_text("succeeded")
    # On the timeline: a bar for each run, in its provider slot and its conversation.
    page.locator('nav a[href="#timeline"]').click()
    expect(page.locator(f'#timeline rect.succeeded[data-run="{second}"]')).to_have_count(1)
    page.select_option("#lanes", "conversation")
    expect(page.locator("#timeline .lane-label", has_text="queue")).to_have_count(1)
    expect(page.locator(f'#timeline rect.succeeded[data-run="{first}"]')).to_have_count(1)
    assert page.evaluate("window.notReloaded") is True


def test_runs_without_a_conversation_wait_behind_nothing(herd: Herd, page: Page) -> None:
    # Runs submitted without a conversation share no lane: none waits behind another,
    # and none is shown under a conversation called "null".
    page.goto(f"{herd.url}/#overview")
    blocker = herd.submit("blocker", "blocking")
    loose = [herd.submit(f"loose{n}", None) for n in (1, 2)]
    running, queued = page.locator("#running"), page.locator("#queued")
    expect(running.locator(f'tr[data-run="{blocker}"]')).to_be_visible()
    for run_id in loose:
        row = queued.locator(f'tr[data-run="{run_id}"]')
        expect(row.locator("td").first).to_have_text("—")
        expect(row.locator("td.behind")).to_have_text("")
    open_gate(herd.directory, "blocker")
    expect(running.locator(f'tr[data-run="{loose[0]}"] td').nth(2)).to_have_text("—")
    open_gate(herd.directory, "loose1")
    open_gate(herd.directory, "loose2")
    page.goto(f"{herd.url}/#runs")
    row = page.locator(f'#recent tr[data-run="{loose[1]}"]')
    expect(row.locator(".status")).to_have_text("succeeded")
    expect(row.locator("td").nth(3)).to_have_text("—")
    # On the timeline by conversation, each has a lane of its own, named by its id.
    page.locator('nav a[href="#timeline"]').click()
    page.select_option("#lanes", "conversation")
    for run_id in loose:
        expect(page.locator("#timeline .lane-label", has_text=run_id[:30])).to_have_count(1)
    expect(page.locator("#timeline .lane-label", has_text="null")).to_have_count(0)


def test_a_run_is_cancelled_from_the_page(herd: Herd, page: Page) -> None:
    page.goto(f"{herd.url}/#overview")
    run_id = herd.submit("never", "cancelled")
    page.get_by_role("button", name=f"Cancel run {run_id}").click()
    page.goto(f"{herd.url}/#runs")
    expect(page.locator(f'#recent tr[data-run="{run_id}"] .status')).to_have_text("cancelled")
    assert herd.api.get(f"/v1/runs/{run_id}").json()["status"] == "cancelled"


def test_a_rejected_reload_shows_its_errors(herd: Herd, page: Page) -> None:
    page.goto(f"{herd.url}/#config")
    good = herd.config.read_text()
    herd.config.write_text(BROKEN)
    try:
        page.get_by_role("button", name="Reload the file").click()
        errors = page.locator("#reload-errors")
        expect(errors).to_be_visible()
        expect(errors).to_contain_text("was rejected")
        expect(errors).to_contain_text("providers.gate.concurrency")
    finally:
        herd.config.write_text(good)
    page.get_by_role("button", name="Reload the file").click()
    expect(page.locator("#reload-errors")).to_be_hidden()


def test_a_log_opens_and_follows_the_run(herd: Herd, page: Page) -> None:
    run_id = herd.submit("logged", "logs")
    page.goto(f"{herd.url}/#overview")
    page.locator(f'#running a[href="#log/{run_id}"]').click()
    log = page.locator("#log")
    expect(log).to_have_text("working on logged\n")
    open_gate(herd.directory, "logged")
    expect(log).to_have_text("working on logged\nfinished logged\n")
    expect(page.locator('dd[data-fact="status"]')).to_have_text("succeeded")


def test_a_browser_without_the_cookie_gets_nothing(herd: Herd, browser: Browser) -> None:
    context = browser.new_context()
    try:
        answer = context.request.get(f"{herd.url}/dashboard/state")
        assert answer.status == 401
        assert answer.json() == {"error": "log in first"}
        page = context.new_page()
        page.goto(herd.url)
        expect(page.get_by_label("API token")).to_be_visible()
        assert page.locator("#view-overview").count() == 0
    finally:
        context.close()


def test_a_trace_opens_in_the_same_timeline(browser: Browser, tmp_path: Path) -> None:
    # The replay of the sample day that ships with herdsman (the day itself has no starts).
    day = Path(__file__).parents[3] / "sim" / "team-day.golden.jsonl"
    out = tmp_path / "day.html"
    viewed = subprocess.run(
        [sys.executable, "-m", "herdsman", "sim", "view", str(day), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert viewed.returncode == 0, viewed.stderr
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    try:
        watched = Watched(context.new_page())
        page = watched.page
        page.goto(out.as_uri())
        expect(page.locator("#timeline rect.succeeded").first).to_be_visible()
        # 199 runs were submitted; 10 attempts hit a usage limit and were drawn on their own.
        expect(page.locator("#summary")).to_contain_text(
            "199 runs, 198 started, 10 more attempts ended by a usage limit, over "
        )
        slots = page.locator("#timeline .lane-label").all_text_contents()
        assert slots[0].startswith("claude slot 1")
        page.select_option("#lanes", "conversation")
        expect(page.locator("#timeline rect.wait").first).to_be_attached()
        assert watched.errors == []
    finally:
        context.close()


FLAKY = (
    "[providers.flaky]\n"
    f'exec = ["{sys.executable}", "-m", "herdsman.demo_agent", "--delay", "0",'
    ' "--protocol", "claude", "--overloaded", "1"]\n'
    'protocol = "claude"\n'
    "[providers.flaky.retry]\n"
    'backoff = "1h"\n'
    'backoff_max = "1h"\n'
)


def test_a_run_waiting_to_retry_is_counted_queued_and_said_apart(
    browser: Browser, tmp_path: Path
) -> None:
    """The overview agrees with ``herdsman status``: queued, with how many wait to retry."""
    herd = Herd(tmp_path, extra=FLAKY)
    try:
        run_id = herd.submit("hello", "c", provider="flaky")
        deadline = time.monotonic() + 30
        while not herd.api.get("/v1/status").json()["retrying"]:
            assert time.monotonic() < deadline, herd.output()
            time.sleep(0.05)
        with logged_in_page(herd, browser) as watched:
            page = watched.page
            page.goto(f"{herd.url}/#overview")
            card = page.locator('[data-card="queued"]')
            expect(card.locator("b")).to_have_text("1")
            expect(card.locator("span")).to_contain_text("queued (1 waiting to retry, the first at")
            row = page.locator('#providers tr[data-provider="flaky"] td')
            expect(row.nth(2)).to_have_text("1 (1 retrying)")
            expect(row.nth(3)).to_have_text("0")  # not parked: that is a fleet's refused claim
            expect(page.locator(f'#queued tr[data-run="{run_id}"]')).to_be_visible()
    finally:
        herd.close()
