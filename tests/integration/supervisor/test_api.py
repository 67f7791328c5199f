"""The supervisor through its real HTTP API: intake, scheduling, execution, shutdown."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import httpx
import trio
from supervisor_support import Running, Start, config_at, git_repository, write_config

from herdsman.trace import read_trace


async def submit(running: Running, expect: int = 201, **body: Any) -> dict[str, Any]:
    body.setdefault("provider", "demo")
    body.setdefault("prompt", "hello")
    response = await running.client.post("/v1/runs", json=body)
    assert response.status_code == expect, response.text
    result: dict[str, Any] = response.json()
    return result


def max_overlap(runs: list[dict[str, Any]]) -> int:
    """The largest number of runs whose [started_at, finished_at) intervals overlap."""
    points = []
    for run in runs:
        points.append((run["started_at"], 1))
        points.append((run["finished_at"], -1))
    current = best = 0
    for _, delta in sorted(points, key=lambda p: (p[0], p[1])):
        current += delta
        best = max(best, current)
    return best


async def test_a_run_is_executed_and_its_reply_recorded(start: Start, tmp_path: Path) -> None:
    running = await start(config_at(write_config(tmp_path)))
    created = await submit(running, prompt="about trio\nwrite a haiku", conversation="c1")
    assert created["status"] in ("queued", "running")
    done = await running.wait(created["id"])
    assert done["status"] == "succeeded"
    assert done["result"] == "demo reply: write a haiku\n"
    assert done["exit_code"] == 0
    assert done["started_at"] >= done["submitted_at"]
    log = Path(done["log_path"])
    assert log.read_text().strip() == "demo reply: write a haiku"


async def test_submitting_a_known_id_returns_the_existing_run(start: Start, tmp_path: Path) -> None:
    running = await start(config_at(write_config(tmp_path)))
    first = await submit(running, id="job-1", prompt="first")
    again = await submit(running, expect=200, id="job-1", prompt="something else")
    assert again["id"] == "job-1"
    assert again["prompt"] == "first"
    assert again["seq"] == first["seq"]
    done = await running.wait("job-1")
    assert done["result"] == "demo reply: first\n"
    listed = (await running.client.get("/v1/runs")).json()["runs"]
    assert [r["id"] for r in listed] == ["job-1"]


async def test_caps_hold_under_load(start: Start, tmp_path: Path) -> None:
    running = await start(config_at(write_config(tmp_path, concurrency=2, delay=0.3)))
    ids = [(await submit(running, conversation=f"c{n}"))["id"] for n in range(8)]
    runs = [await running.wait(run_id) for run_id in ids]
    assert all(r["status"] == "succeeded" for r in runs)
    assert max_overlap(runs) == 2
    # Earliest submitted first among free runs.
    starts = sorted(runs, key=lambda r: r["started_at"])
    assert [r["seq"] for r in starts[:2]] == sorted(r["seq"] for r in runs)[:2]


async def test_one_conversation_runs_in_order_without_overlap(start: Start, tmp_path: Path) -> None:
    running = await start(config_at(write_config(tmp_path, concurrency=4, delay=0.2)))
    ids = [(await submit(running, conversation="same", prompt=f"p{n}"))["id"] for n in range(3)]
    other = await submit(running, conversation="other")
    runs = [await running.wait(run_id) for run_id in ids]
    assert max_overlap(runs) == 1
    assert [r["started_at"] for r in runs] == sorted(r["started_at"] for r in runs)
    # The other conversation was not held up behind the busy one.
    other_done = await running.wait(other["id"])
    assert other_done["started_at"] < runs[1]["started_at"]


async def test_on_busy_skip_records_the_run_as_skipped(start: Start, tmp_path: Path) -> None:
    running = await start(config_at(write_config(tmp_path, delay=0.5)))
    first = await submit(running, conversation="c")
    skipped = await submit(running, conversation="c", on_busy="skip")
    assert skipped["status"] == "skipped"
    assert skipped["reason"] == "its conversation or agent already had a queued or running run"
    await running.wait(first["id"])
    free = await submit(running, conversation="c", on_busy="skip")
    assert free["status"] in ("queued", "running")


async def test_cancel_a_queued_and_a_running_run(start: Start, tmp_path: Path) -> None:
    running = await start(config_at(write_config(tmp_path, concurrency=1, delay=30)))
    busy = await submit(running)
    queued = await submit(running)
    response = await running.client.post(f"/v1/runs/{queued['id']}/cancel")
    assert response.status_code == 200
    assert response.json()["status"] == "cancelled"
    with trio.fail_after(10):
        while (await running.client.get(f"/v1/runs/{busy['id']}")).json()["status"] != "running":
            await trio.sleep(0.05)
    response = await running.client.post(f"/v1/runs/{busy['id']}/cancel")
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["status"] == "cancelled"
    assert body["reason"] == "cancel requested"
    again = await running.client.post(f"/v1/runs/{busy['id']}/cancel")
    assert again.status_code == 409
    assert "already ended as cancelled" in again.json()["error"]


async def test_requests_without_the_token_are_refused(start: Start, tmp_path: Path) -> None:
    running = await start(config_at(write_config(tmp_path)))
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        async with httpx.AsyncClient(base_url=running.client.base_url, headers=headers) as bare:
            response = await bare.get("/v1/status")
        assert response.status_code == 401
        assert "bearer token" in response.json()["error"]
    token_file = running.config.supervisor.state_dir / "api-token"
    assert token_file.stat().st_mode & 0o777 == 0o600


async def test_bad_requests_get_precise_errors(start: Start, tmp_path: Path) -> None:
    running = await start(config_at(write_config(tmp_path)))
    post = running.client.post
    response = await post("/v1/runs", content=b"{not json")
    assert response.status_code == 400
    cases: list[tuple[dict[str, Any], str]] = [
        (
            {"provider": "nope", "prompt": "x"},
            "provider: unknown provider 'nope'; configured: demo",
        ),
        ({"provider": "demo", "prompt": "  "}, "prompt: required and must not be empty"),
        ({"provider": "demo", "prompt": "x", "colour": 1}, "colour: unknown field"),
        ({"provider": "demo", "prompt": "x", "conversation": "a\x00b"}, "conversation: must not"),
        ({"provider": "demo", "prompt": "x", "agent": "a" * 10_000}, "agent: must be at most 256"),
        ({"provider": "demo", "prompt": "x", "id": "../etc"}, "id: must start with a letter"),
        ({"provider": "demo", "prompt": "x", "on_busy": "wait"}, 'on_busy: must be "queue"'),
        ({"provider": "demo", "prompt": 3}, "prompt: must be a string, got int"),
    ]
    for body, message in cases:
        response = await post("/v1/runs", json=body)
        assert response.status_code == 422, body
        assert response.json()["error"].startswith(message), response.json()
    assert (await running.client.get("/v1/runs/nope")).status_code == 404
    assert (await running.client.get("/v1/runs", params={"status": "x"})).status_code == 422
    assert (await running.client.get("/v1/runs/x", params={"wait": "soon"})).status_code == 422
    # Nothing was recorded by any of the refused requests.
    assert (await running.client.get("/v1/runs")).json()["runs"] == []


async def test_a_hostile_conversation_id_is_contained(start: Start, tmp_path: Path) -> None:
    running = await start(config_at(write_config(tmp_path)))
    run = await submit(running, conversation="../../escape")
    done = await running.wait(run["id"])
    assert done["status"] == "succeeded"
    assert done["conversation"] == "../../escape"
    assert not (tmp_path / "escape").exists()
    assert not (tmp_path.parent / "escape").exists()


async def test_status_and_metrics(start: Start, tmp_path: Path) -> None:
    running = await start(config_at(write_config(tmp_path, concurrency=1, delay=0.5)))
    first = await submit(running, conversation="a")
    await submit(running, conversation="a")
    status = (await running.client.get("/v1/status")).json()
    assert status["limits"] == {"global": None, "providers": {"demo": 1}}
    assert status["queued_by_lane"] == {"conversation:default/a": 1}
    assert status["oldest_queued_age"] >= 0
    assert "fleet" not in status  # a supervisor alone: nothing about fleets
    gauges = (await running.client.get("/metrics")).text
    assert 'herdsman_queued_runs{provider="demo"} 1.0' in gauges
    await running.wait(first["id"])
    metrics = (await running.client.get("/metrics")).text
    assert 'herdsman_runs_finished_total{outcome="succeeded",provider="demo"} 1.0' in metrics
    assert "herdsman_queue_wait_seconds_bucket" in metrics
    refused = await running.client.post("/v1/reload")
    assert refused.status_code == 422
    assert refused.json()["errors"] == ["this supervisor was started without a file to reload"]


async def test_graceful_shutdown_lets_running_runs_finish(start: Start, tmp_path: Path) -> None:
    running = await start(config_at(write_config(tmp_path, concurrency=1, delay=0.5)))
    busy = await submit(running)
    queued = await submit(running)
    with trio.fail_after(10):
        while (await running.client.get(f"/v1/runs/{busy['id']}")).json()["status"] != "running":
            await trio.sleep(0.02)
    running.supervisor.request_shutdown()
    refused = await running.client.post("/v1/runs", json={"provider": "demo", "prompt": "late"})
    assert refused.status_code == 503
    with trio.fail_after(20):
        await running.stopped.wait()
    from herdsman.runtime.store import SqliteStore

    store = SqliteStore(running.config.supervisor.state_dir / "herdsman.db")
    try:
        after_busy = store.get(busy["id"])
        after_queued = store.get(queued["id"])
        assert after_busy is not None
        assert after_busy.status.value == "succeeded"
        assert after_queued is not None
        assert after_queued.status.value == "queued"  # stays queued for the next start
    finally:
        store.close()


async def test_a_second_shutdown_request_cancels_running_runs(start: Start, tmp_path: Path) -> None:
    running = await start(config_at(write_config(tmp_path, concurrency=1, delay=60)))
    busy = await submit(running)
    with trio.fail_after(10):
        while (await running.client.get(f"/v1/runs/{busy['id']}")).json()["status"] != "running":
            await trio.sleep(0.02)
    running.supervisor.request_shutdown()
    running.supervisor.request_shutdown()
    with trio.fail_after(20):
        await running.stopped.wait()
    trace_dir = running.config.trace.dir
    (trace_file,) = trace_dir.glob("trace-*.jsonl")
    _header, events = read_trace(trace_file)
    # Its fields but the moment its end was read ("ended", before the line).
    finishes = [{**e.fields, "ended": None} for e in events if e.event == "finish"]
    assert finishes == [
        {
            "run_id": busy["id"],
            "outcome": "cancelled",
            "exit_code": finishes[0]["exit_code"],
            "ended": None,
        }
    ]


async def test_every_decision_is_traced(start: Start, tmp_path: Path) -> None:
    running = await start(config_at(write_config(tmp_path, concurrency=1, delay=0.1)))
    first = await submit(running, id="r1", conversation="c")
    await submit(running, id="r2", conversation="c")
    await running.client.post("/v1/runs/r2/cancel")
    await running.wait(first["id"])
    (trace_file,) = running.config.trace.dir.glob("trace-*.jsonl")
    header, events = read_trace(trace_file)
    assert header.config["providers"]["demo"]["concurrency"] == 1
    got = [(e.event, e.fields.get("run_id") or e.fields["run"]["id"]) for e in events]
    by_run = {run_id: [kind for kind, rid in got if rid == run_id] for run_id in ("r1", "r2")}
    assert by_run == {"r1": ["submit", "start", "finish"], "r2": ["submit", "cancel"]}
    assert got.index(("submit", "r1")) < got.index(("submit", "r2"))
    first_line = json.loads(trace_file.read_text().splitlines()[1])
    assert first_line["run"] == {
        "id": "r1",
        "provider": "demo",
        "conversation": "c",
        "workspace": "default",
    }


async def test_parallel_runs_get_the_preamble_and_environment(start: Start, tmp_path: Path) -> None:
    script = (
        "import os, sys; prompt = sys.stdin.read(); "
        "print(os.environ['HERDSMAN_RUN_ID'], os.environ['HERDSMAN_CONVERSATION'], "
        "os.environ.get('HERDSMAN_PARALLEL'), os.environ['FROM_PROVIDER'], os.getcwd()); "
        "print(prompt, end='')"
    )
    extra = (
        "[providers.env]\n"
        f'exec = ["{sys.executable}", "-c", "{script}"]\n'
        'env = { FROM_PROVIDER = "yes" }\n'
    )
    running = await start(config_at(write_config(tmp_path, preamble=True, extra=extra)))
    run = await submit(running, provider="env", prompt="the task", conversation="conv")
    done = await running.wait(run["id"])
    assert done["status"] == "succeeded", done
    first, *rest = done["result"].splitlines()
    state_dir = running.config.supervisor.state_dir
    assert first.split() == [run["id"], "conv", "1", "yes", str(state_dir / "workspace")]
    prompt = "\n".join(rest)
    assert prompt.startswith("[herdsman] Other agent runs may be executing")
    assert prompt.endswith("\n\nthe task")
    # A run that names a working directory runs there.
    (tmp_path / "elsewhere").mkdir()
    there = await submit(running, provider="env", prompt="t", cwd=str(tmp_path / "elsewhere"))
    done = await running.wait(there["id"])
    assert done["result"].splitlines()[0].split()[-1] == str((tmp_path / "elsewhere").resolve())


async def test_a_batch_is_queued_in_order_and_refused_whole_when_one_run_is_bad(
    start: Start, tmp_path: Path
) -> None:
    running = await start(config_at(write_config(tmp_path, concurrency=2, delay=0.2)))
    bad = await running.client.post(
        "/v1/runs/batch",
        json={"runs": [{"provider": "demo", "prompt": "ok"}, {"provider": "demo", "prompt": ""}]},
    )
    assert bad.status_code == 422
    assert bad.json()["error"] == "runs[1].prompt: required and must not be empty"
    assert (await running.client.get("/v1/runs")).json()["runs"] == []

    runs = [
        {"provider": "demo", "prompt": "one", "id": "b1", "conversation": "c"},
        {"provider": "demo", "prompt": "two", "id": "b2", "conversation": "c", "on_busy": "skip"},
        {"provider": "demo", "prompt": "three", "id": "b3", "conversation": "c"},
        {"provider": "demo", "prompt": "again", "id": "b1"},
    ]
    response = await running.client.post("/v1/runs/batch", json={"runs": runs})
    assert response.status_code == 200, response.text
    results = response.json()["results"]
    assert [(r["run"]["id"], r["created"]) for r in results] == [
        ("b1", True),
        ("b2", True),
        ("b3", True),
        ("b1", False),
    ]
    # b2 is skipped: b1, earlier in the same batch, already holds the conversation.
    assert results[1]["run"]["status"] == "skipped"
    done = [await running.wait(run_id) for run_id in ("b1", "b3")]
    assert [r["status"] for r in done] == ["succeeded", "succeeded"]
    assert done[0]["finished_at"] <= done[1]["started_at"]


AGENT_WITH_SESSIONS = """\
import json, sys
sys.stdin.read()
print(json.dumps({"type": "system", "subtype": "init", "session_id": "sess-42"}))
print(json.dumps({"type": "result", "subtype": "success", "is_error": False,
                  "result": "args:" + " ".join(sys.argv[1:]), "session_id": "sess-42"}))
"""


async def test_a_conversations_next_run_resumes_the_reported_session(
    start: Start, tmp_path: Path
) -> None:
    agent = tmp_path / "agent.py"
    agent.write_text(AGENT_WITH_SESSIONS)
    extra = (
        "[providers.claude]\n"
        f'exec = ["{sys.executable}", "{agent}"]\n'
        'protocol = "claude"\n'
        'resume_args = ["--resume", "{session}"]\n'
    )
    running = await start(config_at(write_config(tmp_path, extra=extra)))
    first = await running.wait((await submit(running, provider="claude", conversation="c"))["id"])
    assert first["status"] == "succeeded", first
    assert (first["result"], first["session_id"]) == ("args:", "sess-42")
    second = await running.wait((await submit(running, provider="claude", conversation="c"))["id"])
    assert second["result"] == "args:--resume sess-42"
    other = await running.wait((await submit(running, provider="claude", conversation="d"))["id"])
    assert other["result"] == "args:"  # another conversation starts fresh


async def test_completion_callbacks_are_delivered_and_retried(
    start: Start, tmp_path: Path, nursery: trio.Nursery
) -> None:
    from hypercorn.config import Config as HypercornConfig
    from hypercorn.trio import serve
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    received: list[dict[str, Any]] = []
    arrived = trio.Event()

    async def hook(request: Request) -> Response:
        received.append(await request.json())
        if len(received) == 1:
            return Response(status_code=500)  # the first attempt fails: it must be retried
        arrived.set()
        return Response(status_code=204)

    receiver = HypercornConfig()
    receiver.bind = ["127.0.0.1:0"]
    receiver.accesslog = None
    app = Starlette(routes=[Route("/hook", hook, methods=["POST"])])
    (url,) = await nursery.start(serve, app, receiver)
    running = await start(config_at(write_config(tmp_path)))
    run = await submit(running, callback_url=f"{url}/hook", metadata={"ticket": 7})
    with trio.fail_after(15):
        await arrived.wait()
    assert [r["id"] for r in received] == [run["id"], run["id"]]
    assert received[-1]["status"] == "succeeded"
    assert received[-1]["metadata"] == {"ticket": 7}


async def test_hostile_bodies_get_4xx_json_never_500(start: Start, tmp_path: Path) -> None:
    running = await start(config_at(write_config(tmp_path)))
    post = running.client.post
    raw_cases = [
        b'{"provider": "demo", "prompt": "x", "metadata": {"a": NaN}}',
        b'{"provider": "demo", "prompt": "x", "n": ' + b"9" * 5000 + b"}",
        b"[" * 100_000 + b"]" * 100_000,
    ]
    for raw in raw_cases:
        response = await post("/v1/runs", content=raw)
        assert response.status_code == 400, raw[:60]
        assert "not valid JSON" in response.json()["error"]
    cases: list[tuple[dict[str, Any], str]] = [
        ({"provider": "demo", "prompt": "\ud800"}, "prompt: must be valid Unicode text"),
        ({"provider": "demo", "prompt": "a\u0000b"}, "prompt: must not contain a NUL"),
        ({"provider": "demo", "prompt": "x", "conversation": "\0"}, "conversation: must not"),
        ({"provider": "demo", "prompt": "x", "callback_url": "http://[::1/"}, "callback_url: not"),
        ({"provider": "demo", "prompt": "x", "callback_url": "http://x:abc/"}, "callback_url: not"),
        ({"provider": "demo", "prompt": "x", "callback_url": "ftp://x/"}, "callback_url: must be"),
        ({"provider": "demo", "prompt": "x", "metadata": {"k": "\udcff"}}, "metadata: must be"),
    ]
    for body, message in cases:
        # json.dumps escapes lone surrogates as \ud800, as a JSON client may send them.
        response = await post("/v1/runs", content=json.dumps(body).encode())
        assert response.status_code == 422, body
        assert response.json()["error"].startswith(message), response.json()
    assert (await running.client.get("/v1/runs")).json()["runs"] == []


LONE_SURROGATE_AGENT = """\
import json, sys
sys.stdin.read()
print(json.dumps({"type": "result", "is_error": False, "result": "bad \\ud800 text\\u0000",
                  "session_id": "s\\udcff"}))
"""


async def test_an_agent_reply_that_is_not_text_is_stored_and_harms_nobody(
    start: Start, tmp_path: Path
) -> None:
    agent = tmp_path / "agent.py"
    agent.write_text(LONE_SURROGATE_AGENT)
    extra = f'[providers.odd]\nexec = ["{sys.executable}", "{agent}"]\nprotocol = "claude"\n'
    running = await start(config_at(write_config(tmp_path, delay=1, extra=extra)))
    bystander = await submit(running, conversation="b")
    odd = await running.wait((await submit(running, provider="odd", conversation="c"))["id"])
    assert odd["status"] == "succeeded", odd
    assert odd["result"] == "bad ? text\ufffd"
    assert (await running.wait(bystander["id"]))["status"] == "succeeded"


async def test_long_polls_end_when_the_supervisor_stops(
    start: Start, tmp_path: Path, nursery: trio.Nursery
) -> None:
    running = await start(config_at(write_config(tmp_path, delay=60)))
    run = await submit(running)
    answered = trio.Event()
    answers: list[int] = []

    async def long_poll() -> None:
        response = await running.client.get(f"/v1/runs/{run['id']}", params={"wait": 300})
        answers.append(response.status_code)
        answered.set()

    nursery.start_soon(long_poll)
    with trio.fail_after(10):  # the poll waits in the supervisor before the stop
        while running.supervisor.long_polls != 1:
            await trio.sleep(0.01)
    running.supervisor.request_shutdown()
    running.supervisor.request_shutdown()
    with trio.fail_after(15):
        await answered.wait()
    assert answers == [200]
    assert running.supervisor.long_polls == 0


EDITING_AGENT = """\
import os, pathlib, sys, time
prompt = sys.stdin.read()
repo = pathlib.Path(os.environ["HERDSMAN_REPOS"]) / "app"
notes = repo / "README.md"  # the same tracked file in every conversation
before = notes.read_text()
notes.write_text(before + os.environ["HERDSMAN_RUN_ID"] + "\\n")
time.sleep(0.3)  # long enough for the other conversation's run to overlap
after = notes.read_text()
print(repr(before), repr(after), prompt.splitlines()[1] if len(prompt.splitlines()) > 1 else "")
"""


async def test_each_conversation_works_in_its_own_persistent_checkout(
    start: Start, tmp_path: Path
) -> None:

    repo = git_repository(tmp_path / "app")
    agent = tmp_path / "agent.py"
    agent.write_text(EDITING_AGENT)
    missing = tmp_path / "not-a-repo"
    missing.mkdir()
    extra = (
        f'[[repos]]\nname = "app"\npath = "{repo}"\n[[repos]]\nname = "gone"\npath = "{missing}"\n'
    )
    provider = f'[providers.edit]\nexec = ["{sys.executable}", "{agent}"]\nconcurrency = 2\n'
    running = await start(config_at(write_config(tmp_path, extra_provider=provider, extra=extra)))
    # Two conversations edit the same file of the same repo at the same time.
    await submit(running, provider="edit", id="a1", conversation="a")
    await submit(running, provider="edit", id="b1", conversation="b")
    a1 = await running.wait("a1")
    b1 = await running.wait("b1")
    assert b1["started_at"] < a1["finished_at"]  # they did overlap
    a2 = await running.wait(
        (await submit(running, provider="edit", id="a2", conversation="a"))["id"]
    )
    assert [r["status"] for r in (a1, b1, a2)] == ["succeeded"] * 3, (a1, b1, a2)
    # Each conversation sees only its own edits; the original is untouched.
    assert a1["result"].startswith("'hello\\n' 'hello\\na1\\n'")
    assert b1["result"].startswith("'hello\\n' 'hello\\nb1\\n'")
    assert a2["result"].startswith("'hello\\na1\\n' 'hello\\na1\\na2\\n'")
    assert (repo / "README.md").read_text() == "hello\n"
    # The agent is told where its checkout is and what it replaces.
    worktrees = running.config.supervisor.state_dir / "worktrees"
    assert a1["result"].split(" ", 2)[2].startswith(f"- {worktrees}/a-")
    assert f"replaces {repo}" in a1["result"]
    # A repo that cannot be checked out does not fail the run: it is noted on it.
    (note,) = a1["notes"]
    assert note.startswith("repository gone was read-only for this run: it could not be")


async def test_runs_in_overlapping_directories_never_overlap(start: Start, tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (repo / "sub").mkdir(parents=True)
    (tmp_path / "other").mkdir()
    (tmp_path / "link").symlink_to(repo)
    running = await start(config_at(write_config(tmp_path, concurrency=4, delay=0.4)))
    refused = await running.client.post(
        "/v1/runs", json={"provider": "demo", "prompt": "x", "cwd": "repo/sub"}
    )
    assert refused.status_code == 422
    assert refused.json()["error"].startswith("cwd: must be an absolute path")
    outer = await submit(running, cwd=str(repo))
    inner = await submit(running, cwd=str(tmp_path / "link" / "sub"))  # /repo/sub, via a link
    other = await submit(running, cwd=str(tmp_path / "other"))
    assert inner["cwd"] == str((repo / "sub").resolve())
    runs = [await running.wait(r["id"]) for r in (outer, inner, other)]
    assert [r["status"] for r in runs] == ["succeeded"] * 3, runs
    outer_done, inner_done, other_done = runs
    assert inner_done["started_at"] >= outer_done["finished_at"]  # overlapping: one after the other
    assert other_done["started_at"] < outer_done["finished_at"]  # disjoint: side by side


async def test_a_run_that_cannot_be_spawned_says_why_in_plain_words(
    start: Start, tmp_path: Path
) -> None:
    # No Python repr (PosixPath('...'), [Errno 2]) in a reason a user reads.
    not_executable = tmp_path / "agent.sh"
    not_executable.write_text("#!/bin/sh\necho hi\n")
    not_executable.chmod(0o644)
    providers = (
        f'[providers.gone]\nexec = ["{tmp_path / "no-such-agent"}"]\n'
        f'[providers.locked]\nexec = ["{not_executable}"]\n'
    )
    running = await start(config_at(write_config(tmp_path, extra_provider=providers)))
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    # Not refused at submit time: in a fleet the folder may exist on another member.
    cases: list[tuple[dict[str, Any], str]] = [
        (
            {"cwd": str(tmp_path / "nowhere")},
            f"its working directory {tmp_path / 'nowhere'} does not exist",
        ),
        ({"cwd": str(a_file)}, f"its working directory {a_file} is not a directory"),
        ({"provider": "gone"}, f"its program {tmp_path / 'no-such-agent'} was not found"),
        (
            {"provider": "locked"},
            f"its program {not_executable} may not be run (permission denied)",
        ),
    ]
    for body, why in cases:
        done = await running.wait((await submit(running, **body))["id"])
        provider = body.get("provider", "demo")
        assert (done["status"], done["reason"]) == ("failed", f"could not start {provider}: {why}")
