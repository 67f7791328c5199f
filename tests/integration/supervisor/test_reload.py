"""Reloading supervisor.toml under a running supervisor: all of a change, or none of it."""

from __future__ import annotations

import os
import sqlite3
import sys
from pathlib import Path
from typing import Any

import pytest
import trio
from supervisor_support import Running, Start, git_repository, write_config

from herdsman.config import ConfigError, load_config
from herdsman.runtime.main import DB_NAME
from herdsman.trace import TraceEvent, read_trace


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, (old, text)
    path.write_text(text.replace(old, new, 1))


async def reload(running: Running, expect: int = 200) -> dict[str, Any]:
    response = await running.client.post("/v1/reload")
    assert response.status_code == expect, response.text
    body: dict[str, Any] = response.json()
    return body


async def status(running: Running) -> dict[str, Any]:
    body: dict[str, Any] = (await running.client.get("/v1/status")).json()
    return body


def trace_events(tmp_path: Path) -> list[TraceEvent]:
    [path] = (tmp_path / "state" / "traces").glob("*.jsonl")
    _, events = read_trace(path)
    return list(events)


def check_caps_in_force(events: list[TraceEvent], provider: str, first_cap: int) -> list[int]:
    """Walk the trace: no start while the provider's cap in force was full.

    Returns the most runs ever running under each cap, in order.
    """
    cap, running, peaks = first_cap, set[str](), [0]
    for event in events:
        if event.event == "reload":
            cap = event.fields["config"]["providers"][provider]["concurrency"]
            peaks.append(len(running))
        elif event.event == "start":
            assert len(running) < cap, f"start {event.fields['run_id']} with {running} at cap {cap}"
            running.add(event.fields["run_id"])
            peaks[-1] = max(peaks[-1], len(running))
        elif event.event == "finish":
            running.discard(event.fields["run_id"])
    return peaks


async def test_raising_and_lowering_concurrency_mid_load_follows_the_cap_in_force(
    start: Start, tmp_path: Path
) -> None:
    # Runs long enough to outlast two reloads on a loaded machine: the
    # checks below count the runs still running after each.
    path = write_config(tmp_path, concurrency=1, delay=3)
    running = await start(path)
    runs = [
        (await running.client.post("/v1/runs", json={"provider": "demo", "prompt": "x"})).json()
        for _ in range(8)
    ]
    await trio.sleep(0.2)
    edit(path, "concurrency = 1", "concurrency = 4")
    raised = await reload(running)
    assert raised["changes"] == [
        {
            "key": "providers.demo.concurrency",
            "change": "changed",
            "old": "1",
            "new": "4",
            "applied": True,
        }
    ]
    assert raised["generation"] == 2
    # Raising starts queued runs at once.
    assert (await status(running))["running"] == 4
    edit(path, "concurrency = 4", "concurrency = 2")
    assert (await reload(running))["generation"] == 3
    # Lowering stops nothing: the four keep running.
    assert (await status(running))["running"] == 4
    for run in runs:
        assert (await running.wait(run["id"]))["status"] == "succeeded"
    peaks = check_caps_in_force(trace_events(tmp_path), "demo", first_cap=1)
    assert peaks[1] == 4  # under cap 4, four ran at once
    assert (await status(running))["limits"]["providers"] == {"demo": 2}


INVALID_EDITS = {
    "syntax": ("concurrency = 1", "concurrency = = 1"),
    "unknown key": ("concurrency = 1", "concurency = 1"),
    "wrong type": ("concurrency = 1", 'concurrency = "many"'),
    "out of range": ("concurrency = 1", "concurrency = 65"),
    "missing required": ('exec = ["', 'exek = ["'),
    "rule across keys": ("concurrency = 1", 'concurrency = 1\nresume_args = ["--resume"]'),
}


@pytest.mark.parametrize("kind", sorted(INVALID_EDITS))
async def test_an_invalid_edit_changes_nothing_and_the_next_valid_one_applies(
    start: Start, tmp_path: Path, kind: str
) -> None:
    path = write_config(tmp_path, concurrency=1, delay=0.1)
    running = await start(path)
    good = path.read_text()
    old, new = INVALID_EDITS[kind]
    edit(path, old, new + "\nmax_concurrency = 9" if kind == "syntax" else new)
    with pytest.raises(ConfigError) as expected:
        load_config(path, environ={})
    rejected = await reload(running, expect=422)
    # The same messages `herdsman check` prints: file:line:col, key, reason.
    assert rejected["errors"] == [str(p) for p in expected.value.problems]
    assert rejected["ok"] is False
    assert rejected["generation"] == 1
    now = await status(running)
    assert now["last_reload"]["ok"] is False
    assert now["last_reload"]["errors"] == rejected["errors"]
    assert now["limits"]["providers"] == {"demo": 1}
    assert (
        "herdsman_config_last_reload_successful 0.0" in (await running.client.get("/metrics")).text
    )
    # Behaviour is unchanged: runs still flow under the old configuration.
    run = (await running.client.post("/v1/runs", json={"provider": "demo", "prompt": "x"})).json()
    assert (await running.wait(run["id"]))["status"] == "succeeded"

    path.write_text(good.replace("concurrency = 1", "concurrency = 3"))
    applied = await reload(running)
    assert (applied["ok"], applied["generation"]) == (True, 2)
    assert (await status(running))["limits"]["providers"] == {"demo": 3}
    assert (
        "herdsman_config_last_reload_successful 1.0" in (await running.client.get("/metrics")).text
    )
    kinds = [e.event for e in trace_events(tmp_path) if e.event.startswith("reload")]
    assert kinds == ["reload_rejected", "reload"]


async def test_a_vanished_file_is_a_rejected_reload(start: Start, tmp_path: Path) -> None:
    path = write_config(tmp_path)
    running = await start(path)
    path.rename(tmp_path / "elsewhere.toml")
    rejected = await reload(running, expect=422)
    assert "cannot read file" in rejected["errors"][0] or "no such" in rejected["errors"][0].lower()


async def test_an_editor_style_save_triggers_exactly_one_reload(
    start: Start, tmp_path: Path
) -> None:
    path = write_config(tmp_path, concurrency=1)
    running = await start(path, watch=True)
    await trio.sleep(0.3)
    text = path.read_text()
    # What editors do: write a temporary file in bursts, then rename it over.
    temp = tmp_path / ".supervisor.toml.swp"
    temp.write_text(text[: len(text) // 2])
    await trio.sleep(0.05)
    temp.write_text(text.replace("concurrency = 1", "concurrency = 3"))
    os.replace(temp, path)
    await trio.sleep(0.05)
    os.utime(path)  # and touch it once more, as some do
    with trio.fail_after(10):
        while (await status(running))["generation"] < 2:
            await trio.sleep(0.1)
    await trio.sleep(1.5)  # long enough for a second reload to show up
    reloads = [e for e in trace_events(tmp_path) if e.event.startswith("reload")]
    assert [e.event for e in reloads] == ["reload"]
    assert (await status(running))["last_reload"]["trigger"] == "file changed"
    assert (await status(running))["limits"]["providers"] == {"demo": 3}


async def test_keys_that_need_a_restart_are_reported_and_kept(start: Start, tmp_path: Path) -> None:
    path = write_config(tmp_path, concurrency=1)
    running = await start(path)
    listen = running.config.api.listen
    edit(path, listen, "127.0.0.1:1")
    edit(path, 'state_dir = "state"', 'state_dir = "moved"')
    edit(path, "concurrency = 1", "concurrency = 2")
    with path.open("a") as file:
        file.write('\n[store]\nurl = "postgresql://db.invalid/herdsman"\n[fleet]\nenabled = true\n')
    body = await reload(running)
    by_key = {c["key"]: c for c in body["changes"]}
    assert by_key.pop("providers.demo.concurrency")["applied"] is True
    # The rest wait for a restart: the address, the state directory and what
    # follows it (the token file, the trace folder), the ledger's database...
    # ... and joining a fleet.
    assert {
        "api.listen",
        "supervisor.state_dir",
        "api.token_file",
        "store.url",
        "fleet.enabled",
    } <= set(by_key)
    assert running.supervisor.config.store.url is None
    assert running.supervisor.config.fleet.enabled is False
    assert all(not change["applied"] for change in by_key.values())
    # ... while live settings whose defaults follow state_dir stay where they are.
    assert "providers.demo.workdir" not in by_key
    # Still answering where it listened; still writing where it wrote.
    assert (await status(running))["limits"]["providers"] == {"demo": 2}
    assert running.supervisor.config.supervisor.state_dir == tmp_path / "state"
    # status shows what waits for a restart, as the reload reported it.
    waiting = (await status(running))["waiting_for_restart"]
    assert {c["key"] for c in waiting} == set(by_key)
    # Asking again about the same file gives the same answer, marked as a repeat...
    assert await reload(running) == body | {"repeat": True}
    # ... and the next edit still reports what waits for a restart.
    edit(path, "concurrency = 2", "concurrency = 3")
    again = await reload(running)
    assert sorted(c["key"] for c in again["changes"]) == sorted(
        [*by_key, "providers.demo.concurrency"]
    )
    assert (body["generation"], again["generation"]) == (2, 3)
    # A rejected edit changes nothing, and the settings still wait.
    edit(path, "concurrency = 3", "concurrency = 0")
    assert not (await reload(running, expect=422))["ok"]
    assert {c["key"] for c in (await status(running))["waiting_for_restart"]} == set(by_key)


async def test_a_removed_provider_keeps_its_runs_and_says_why_they_wait(
    start: Start, tmp_path: Path
) -> None:
    slow = '[providers.slow]\nexec = ["herdsman-demo-agent", "--delay", "0.5"]\nconcurrency = 1\n'
    path = write_config(tmp_path, extra_provider=slow)
    running = await start(path)
    busy = (await running.client.post("/v1/runs", json={"provider": "slow", "prompt": "a"})).json()
    waiting = (
        await running.client.post("/v1/runs", json={"provider": "slow", "prompt": "b"})
    ).json()
    await trio.sleep(0.1)
    edit(path, slow, "")
    body = await reload(running)
    # One line for the provider, not one per setting it had.
    assert body["changes"] == [
        {
            "key": "providers.slow",
            "change": "removed",
            "old": "(table)",
            "new": "(not set)",
            "applied": True,
        }
    ]
    assert (await running.wait(busy["id"]))["status"] == "succeeded"  # the running one finishes
    now = await status(running)
    assert now["queued_by_provider"] == {"slow": 1}
    assert "removed from the configuration" in now["waiting_for_provider"]["slow"]
    path.write_text(path.read_text() + slow)
    assert [c["key"] + " " + c["change"] for c in (await reload(running))["changes"]] == [
        "providers.slow added"
    ]
    assert (await running.wait(waiting["id"]))["status"] == "succeeded"


async def test_accounts_and_agent_exclusivity_change_live(start: Start, tmp_path: Path) -> None:
    path = write_config(tmp_path, concurrency=2, delay=0.3)
    running = await start(path)
    path.write_text(
        path.read_text().replace(
            "[api]",
            '[[providers.demo.accounts]]\nname = "team"\nenv = { TEAM = "1" }\n\n'
            "[scheduling]\nagent_exclusive = false\n\n[api]",
        )
    )
    await reload(running)
    runs = [
        (
            await running.client.post(
                "/v1/runs", json={"provider": "demo", "prompt": "x", "agent": "same"}
            )
        ).json()
        for _ in range(2)
    ]
    await trio.sleep(0.15)
    assert (await status(running))["running"] == 2  # one agent twice: exclusivity is off
    done = [await running.wait(run["id"]) for run in runs]
    assert [r["account"] for r in done] == ["team", "team"]


@pytest.mark.slow
async def test_a_reload_storm_drops_and_duplicates_nothing_and_holds_every_cap(
    start: Start, tmp_path: Path
) -> None:
    path = write_config(tmp_path, concurrency=2, delay=0.0)
    running = await start(path)
    total, storms = 1000, 100
    ids: list[str] = []

    async def flow() -> None:
        for batch in range(total // 50):
            body = {
                "runs": [
                    {"provider": "demo", "prompt": f"{batch}-{n}", "conversation": f"c{n % 7}"}
                    for n in range(50)
                ]
            }
            response = await running.client.post("/v1/runs/batch", json=body)
            assert response.status_code == 200, response.text
            ids.extend(r["run"]["id"] for r in response.json()["results"])
            await trio.sleep(0.02)

    async def storm() -> None:
        for n in range(storms):
            cap = 1 + n % 4
            text = path.read_text()
            for old in range(1, 5):
                text = text.replace(f"concurrency = {old}\n", f"concurrency = {cap}\n")
            path.write_text(text)
            body = await reload(running)
            assert body["ok"]
            await trio.sleep(0.01)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(flow)
        nursery.start_soon(storm)
    assert len(ids) == total
    for run_id in ids:
        assert (await running.wait(run_id, 60))["status"] == "succeeded"
    events = trace_events(tmp_path)
    starts = [e.fields["run_id"] for e in events if e.event == "start"]
    assert sorted(starts) == sorted(ids)  # each exactly once
    check_caps_in_force(events, "demo", first_cap=2)
    assert sum(1 for e in events if e.event == "reload") >= storms // 2


async def test_a_removed_repos_worktrees_are_still_listed_and_swept(
    start: Start, tmp_path: Path
) -> None:
    repo = git_repository(tmp_path / "app")
    block = f'[[repos]]\nname = "app"\npath = "{repo}"\n[retention]\nidle = "0"\n'
    path = write_config(tmp_path, delay=0.0, extra=block)
    running = await start(path)
    run = (
        await running.client.post(
            "/v1/runs", json={"provider": "demo", "prompt": "x", "conversation": "c"}
        )
    ).json()
    assert (await running.wait(run["id"]))["status"] == "succeeded"
    edit(path, f'[[repos]]\nname = "app"\npath = "{repo}"\n', "")
    assert (await reload(running))["ok"]
    listed = (await running.client.get("/v1/worktrees")).json()["worktrees"]
    assert [(w["repo"], w["conversation"]) for w in listed] == [("app", "c")]
    swept = (await running.client.post("/v1/worktrees/sweep", json={})).json()["entries"]
    assert [(e["repo"], e["action"]) for e in swept] == [("app", "removed")]
    assert not any((tmp_path / "state" / "worktrees").glob("*/app"))


async def wait_for_generation(running: Running, generation: int) -> dict[str, Any]:
    with trio.fail_after(15):
        while (now := await status(running))["generation"] < generation:
            await trio.sleep(0.1)
    return now


async def test_a_swapped_symlink_is_followed_again_and_again(start: Start, tmp_path: Path) -> None:
    """As a Kubernetes ConfigMap updates: a new folder, and the link swapped to it."""
    write_config(tmp_path, concurrency=1)
    original = (tmp_path / "supervisor.toml").read_text()
    mount = tmp_path / "mount"
    mount.mkdir()

    def publish(version: int, concurrency: int) -> None:
        folder = mount / f"..v{version}"
        folder.mkdir()
        text = original.replace("concurrency = 1", f"concurrency = {concurrency}")
        (folder / "supervisor.toml").write_text(text.replace('"state"', f'"{tmp_path}/state"'))
        link = mount / "..data.tmp"
        link.symlink_to(folder.name)
        os.replace(link, mount / "..data")

    publish(1, 1)
    (mount / "supervisor.toml").symlink_to("..data/supervisor.toml")
    running = await start(mount / "supervisor.toml", watch=True)
    await trio.sleep(0.3)
    publish(2, 2)
    assert (await wait_for_generation(running, 2))["limits"]["providers"] == {"demo": 2}
    publish(3, 3)
    assert (await wait_for_generation(running, 3))["limits"]["providers"] == {"demo": 3}


async def test_a_folder_removed_and_made_again_is_watched_again(
    start: Start, tmp_path: Path
) -> None:
    folder = tmp_path / "conf"
    folder.mkdir()
    path = write_config(folder, concurrency=1)
    text = path.read_text().replace('"state"', f'"{tmp_path}/state"')
    path.write_text(text)
    running = await start(path, watch=True)
    await trio.sleep(0.3)
    path.unlink()
    folder.rmdir()
    await trio.sleep(1.2)
    folder.mkdir()
    path.write_text(text.replace("concurrency = 1", "concurrency = 2"))
    assert (await wait_for_generation(running, 2))["limits"]["providers"] == {"demo": 2}
    await trio.sleep(0.6)
    path.write_text(text.replace("concurrency = 1", "concurrency = 3"))
    assert (await wait_for_generation(running, 3))["limits"]["providers"] == {"demo": 3}


async def test_a_reloaded_provider_and_account_env_reaches_the_next_run(
    start: Start, tmp_path: Path
) -> None:
    # Each provider's and account's environment is kept per configuration
    # (launch.SpecBuilder): a reload must still reach the very next run.
    script = "import os; print(os.environ['FROM_PROVIDER'], os.environ.get('FROM_ACCOUNT'))"
    extra = (
        "[providers.env]\n"
        f'exec = ["{sys.executable}", "-c", "{script}"]\n'
        'env = { FROM_PROVIDER = "one" }\n'
    )
    path = write_config(tmp_path, extra=extra)
    running = await start(path)

    async def printed() -> list[str]:
        response = await running.client.post("/v1/runs", json={"provider": "env", "prompt": "x"})
        assert response.status_code == 201, response.text
        done = await running.wait(response.json()["id"])
        assert done["status"] == "succeeded", done
        words: list[str] = done["result"].split()
        return words

    assert await printed() == ["one", "None"]
    edit(path, 'FROM_PROVIDER = "one"', 'FROM_PROVIDER = "two"')
    await reload(running)
    assert await printed() == ["two", "None"]
    account = '\n[[providers.env.accounts]]\nname = "a"\nenv = { FROM_ACCOUNT = "A" }\n'
    path.write_text(path.read_text() + account)
    await reload(running)
    assert await printed() == ["two", "A"]
    edit(path, 'FROM_ACCOUNT = "A"', 'FROM_ACCOUNT = "B"')
    await reload(running)
    assert await printed() == ["two", "B"]


async def test_status_reports_an_applied_reload_with_its_generation(
    start: Start, tmp_path: Path
) -> None:
    # An applied reload is traced after every ledger change already on its
    # way; under load that commit takes a while. `status` must meanwhile
    # show the new generation beside this reload's result, never beside the
    # previous reload's (a watcher's journey saw "fix applied" still
    # reported as the typo's rejection). A write lock on the ledger holds
    # that commit here.
    path = write_config(tmp_path, concurrency=1)
    running = await start(path)
    edit(path, "concurrency = 1", "concurency = 1")
    assert (await reload(running, expect=422))["ok"] is False
    edit(path, "concurency = 1", "concurrency = 3")
    locker = sqlite3.connect(running.config.supervisor.state_dir / DB_NAME, isolation_level=None)
    locker.execute("BEGIN IMMEDIATE")
    try:
        async with trio.open_nursery() as nursery:
            answers: list[dict[str, Any]] = []

            async def reloading() -> None:
                answers.append(await reload(running))

            nursery.start_soon(reloading)
            with trio.fail_after(5):
                while (now := await status(running))["generation"] == 1:
                    await trio.sleep(0.02)
            assert answers == []  # its trace event still waits behind the lock
            assert now["limits"]["providers"] == {"demo": 3}
            assert (now["last_reload"]["ok"], now["last_reload"]["generation"]) == (True, 2)
            locker.rollback()
    finally:
        locker.close()
    assert (answers[0]["ok"], answers[0]["generation"]) == (True, 2)
    kinds = [e.event for e in trace_events(tmp_path) if e.event.startswith("reload")]
    assert kinds == ["reload_rejected", "reload"]
