"""What one fuzz seed tries: a configuration, a workload and faults, drawn from the seed.

Every draw comes from one ``random.Random(seed)`` in a fixed order, so a
seed means the same scenario in any process. A scenario is plain data
(JSON-able) so a failing one can be written to a file, cut down by the
minimiser, and read back by ``herdsman sim replay``.

Events (``Scenario.events``, in time order; each stands alone, so the
minimiser may drop any of them):

* ``submit`` — a run (``run``: id, provider, conversation, agent,
  workspace; ``again``: the same submit sent once more), how its
  attempts go (``attempts``: duration, outcome —
  ``failed`` is a provider crash, ``timed_out`` a hang until the idle
  timeout, ``usage_limited`` a usage limit that resets ``resets_in``
  seconds after it is hit; and what its agent's stream says: ``failure``,
  ``worked``, ``spend``, ``warning``, :mod:`herdsman.sim.fuzz.agent_faults`),
  whether the agent leaves files in its
  worktrees (``dirty``), and ``on_busy``; ``on_removal``: sent only once a
  removal of its conversation's worktrees begins (``removal_waits``);
* ``cancel`` — cancel runs (``run_ids``; several at once is a storm);
* ``reload`` — write ``toml`` over the configuration file and reload (an
  invalid one must be rejected and change nothing);
* ``git_failure`` — the next call of git ``operation`` fails;
* ``disk_full`` — the disk is full for ``seconds``;
* ``crash`` — the supervisor dies and is started again on the same ledger;
* ``shutdown`` — a first signal: the supervisor drains; with
  ``force_after`` (seconds), a second signal then cancels what still
  runs; without it, a short ``shutdown_grace`` in the configuration may run
  out first. Once stopped it is started again on the same ledger.
* ``swap_checkout`` — an agent swaps the clean checkout of ``repo`` of a
  conversation (``workspace``, ``conversation``) for a link to the user's
  own worktree of it, outside the state dir;
* ``plant_link`` — a link to a folder outside the state dir is planted where
  that conversation's folder would be made (see ``herdsman.sim.fuzz.links``).

The link faults, the shutdown, the follow-up sent during a removal and
what agents say (with the retry policies and budgets that act on it) are
drawn from streams of their own (``Random("links:SEED")``,
``Random("shutdown SEED")``, ``Random("on removal:SEED")``,
``Random("agents:SEED")``), so adding them left every other draw of a seed
as it was.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Any, TypeGuard

import attrs

from herdsman.sim.fuzz.agent_faults import (
    attempt_problem,
    draw_dress,
    dress_config,
    dress_submit,
)
from herdsman.sim.fuzz.removal_waits import draw_follow_up_on_removal
from herdsman.trace import OUTCOMES

__all__ = ["FAULT_KINDS", "Scenario", "draw_scenario", "scenario_from_json"]

#: Event kinds that are faults (all but submits); the queue must drain once they stop.
FAULT_KINDS = frozenset(
    {
        "cancel",
        "reload",
        "git_failure",
        "disk_full",
        "crash",
        "shutdown",
        "swap_checkout",
        "plant_link",
    }
)

PROVIDERS = ("claude", "codex", "local")
STATE_DIR = "/herdsman-sim/state"
REPOS_DIR = "/herdsman-sim/repos"
GIT_OPERATIONS = ("add_worktree", "add_worktree_on", "worktree_status", "remove_worktree", "head")
CONVERSATIONS = ("c1", "c2", "c3", "c4")
WORKSPACES = ("default", "default", "w2")
#: Ways to spoil a valid file; each must make ``herdsman check`` fail.
SPOILERS = (
    ("concurrency = ", "concurrency = 0 #"),
    ("[supervisor]", "[supervisor]\nno_such_setting = 1"),
    ('exec = ["', 'exec = "'),
    ("[supervisor]", "[supervisor\n"),
    ('idle = "', 'idle = "soon'),
)


@attrs.frozen
class Scenario:
    """A seed's configuration file (TOML) and its events, in time order."""

    seed: int
    config: str
    events: tuple[Mapping[str, Any], ...]
    #: How long each git call takes (simulated seconds): sweeps, checkouts and submits overlap.
    git_latency: float = 0.0

    def as_json(self) -> dict[str, Any]:
        """The scenario as a fuzz case file's header carries it."""
        return {
            "version": 1,
            "seed": self.seed,
            "config": self.config,
            "git_latency": self.git_latency,
            "events": list(self.events),
        }

    def with_events(self, events: Sequence[Mapping[str, Any]]) -> Scenario:
        """The same scenario with only ``events`` (the minimiser's candidates)."""
        return attrs.evolve(self, events=tuple(events))

    @property
    def run_count(self) -> int:
        """How many runs its submit events name (a submit sent again is the same run)."""
        return len({event["run"]["id"] for event in self.events if event["kind"] == "submit"})


class ScenarioError(Exception):
    """A fuzz case file whose scenario is not what ``sim fuzz`` writes."""


def scenario_from_json(data: Mapping[str, Any], where: str) -> Scenario:
    """Read a scenario back from a case file's ``fuzz`` object; ``where`` names the file."""
    if data.get("version") != 1:
        raise ScenarioError(f"{where}: fuzz.version: expected 1, got {data.get('version')!r}")
    seed, config, events = data.get("seed"), data.get("config"), data.get("events")
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise ScenarioError(f"{where}: fuzz.seed: expected a whole number, got {seed!r}")
    if not isinstance(config, str):
        raise ScenarioError(f"{where}: fuzz.config: expected TOML text")
    if not isinstance(events, list):
        raise ScenarioError(f"{where}: fuzz.events: expected a list")
    latency = data.get("git_latency", 0.0)
    if not isinstance(latency, int | float) or isinstance(latency, bool) or latency < 0:
        raise ScenarioError(f"{where}: fuzz.git_latency: expected seconds >= 0, got {latency!r}")
    last = 0.0
    for n, event in enumerate(events):
        name = f"{where}: fuzz.events[{n}]"
        if not isinstance(event, dict) or event.get("kind") not in FAULT_KINDS | {"submit"}:
            kinds = ", ".join(sorted(FAULT_KINDS | {"submit"}))
            raise ScenarioError(f"{name}: expected an object whose kind is one of {kinds}")
        t = event.get("t")
        if not _seconds(t) or t < last:
            raise ScenarioError(f"{name}.t: expected seconds, not before the event above")
        last = float(t)
        problem = _problem(event)
        if problem is not None:
            raise ScenarioError(f"{name}.{problem}")
    return Scenario(seed, config, tuple(events), float(latency))


def _seconds(value: Any) -> TypeGuard[float]:
    """Whether ``value`` is a number of seconds >= 0 (JSON's, so no bool)."""
    return isinstance(value, int | float) and not isinstance(value, bool) and value >= 0


def _problem(event: Mapping[str, Any]) -> str | None:
    """What is wrong with one event's fields (beyond ``t`` and ``kind``), if anything."""
    kind = event["kind"]
    if kind == "submit":
        run = event.get("run")
        if not isinstance(run, dict) or not all(
            isinstance(run.get(key), str) and run[key] for key in ("id", "provider")
        ):
            return "run: expected an object with an id and a provider"
        attempts = event.get("attempts")
        if not isinstance(attempts, list) or not all(
            isinstance(a, dict) and _seconds(a.get("duration")) and a.get("outcome") in OUTCOMES
            for a in attempts
        ):
            return f"attempts: expected a list of {{duration, outcome}}, outcome one of {OUTCOMES}"
        for n, attempt in enumerate(attempts):
            problem = attempt_problem(attempt)
            if problem is not None:
                return f"attempts[{n}].{problem}"
        if not isinstance(event.get("on_removal", False), bool):
            return "on_removal: expected true or false"
    elif kind == "cancel" and not (
        isinstance(event.get("run_ids"), list) and all(isinstance(r, str) for r in event["run_ids"])
    ):
        return "run_ids: expected a list of run ids"
    elif kind == "reload" and not isinstance(event.get("toml"), str):
        return "toml: expected the configuration file's text"
    elif kind == "git_failure" and event.get("operation") not in GIT_OPERATIONS:
        return f"operation: expected one of {', '.join(GIT_OPERATIONS)}"
    elif kind == "disk_full" and not _seconds(event.get("seconds")):
        return "seconds: expected seconds >= 0"
    elif kind == "shutdown" and not (
        event.get("force_after") is None or _seconds(event.get("force_after"))
    ):
        return "force_after: expected seconds >= 0, or null for no second signal"
    elif kind in ("swap_checkout", "plant_link"):
        names = ("workspace", "conversation", "repo") if kind == "swap_checkout" else ()
        for name in names or ("workspace", "conversation"):
            if not isinstance(event.get(name), str) or not event[name]:
                return f"{name}: expected a name"
    return None


def draw_scenario(seed: int) -> Scenario:
    """The scenario of ``seed``: the same in any process."""
    rng = random.Random(seed)
    providers = rng.sample(PROVIDERS, rng.randint(1, len(PROVIDERS)))
    providers.sort(key=PROVIDERS.index)
    layout = _Layout(
        providers=tuple(providers),
        repos=tuple(f"repo{n}" for n in range(rng.choice([0, 1, 1, 2]))),
        agent_exclusive=rng.random() < 0.5,
        idle=rng.choice(["0s", "1m", "10m"]),
        sweep=rng.choice(["30s", "2m"]),
    )
    config = _draw_config(rng, layout)
    events: list[dict[str, Any]] = []
    t = 0.0
    ids: list[str] = []
    for _ in range(rng.randint(6, 24)):
        t += rng.choice([0.0, 0.0, 1.0, 5.0, 20.0, 60.0])
        events.append(_draw_submit(rng, t, len(ids), layout))
        ids.append(events[-1]["run"]["id"])
    end = t
    submits = list(events)
    for _ in range(rng.randint(0, 6)):
        at = round(rng.uniform(0.0, end + 60.0), 3)
        if rng.random() < 0.15:
            # A client that sends a submit again (a retry after a timeout,
            # perhaps across a restart): the same run, never a second one.
            events.append({**rng.choice(submits), "t": at, "again": True})
        else:
            events.append(_draw_fault(rng, at, ids, layout))
    latency = rng.choice([0.0, 0.0, 0.5, 5.0, 40.0])
    config, stop = _draw_shutdown(seed, config, end)
    events += stop
    events += _draw_link_faults(seed, end, layout)
    draw_follow_up_on_removal(seed, events, len(layout.repos), latency)
    dress = draw_dress(seed, layout.providers)
    config = dress_config(config, dress)
    events = [_dressed(seed, event, dress) for event in events]
    # Stable: a fault drawn for the same instant as a submit stays after it.
    events.sort(key=lambda event: event["t"])
    return Scenario(seed, config, tuple(events), latency)


def _dressed(seed: int, event: dict[str, Any], dress: Mapping[str, Any]) -> dict[str, Any]:
    """``event`` with what agents say (a submit) or the seed's policies and budgets (a reload)."""
    if event["kind"] == "submit":
        return dress_submit(seed, event)
    if event["kind"] == "reload":
        return {**event, "toml": dress_config(event["toml"], dress)}
    return event


def _draw_shutdown(seed: int, config: str, end: float) -> tuple[str, list[dict[str, Any]]]:
    """A shutdown fault for some seeds, and for some a short grace: drawn apart.

    From a generator of their own, so that the rest of every seed's
    scenario is what it was before shutdowns were drawn.
    """
    rng = random.Random(f"shutdown {seed}")
    if rng.random() < 0.5:
        grace = rng.choice(["1s", "10s", "1m"])
        config = config.replace("[supervisor]\n", f'[supervisor]\nshutdown_grace = "{grace}"\n', 1)
    if rng.random() >= 0.35:
        return config, []
    at = round(rng.uniform(0.0, end + 60.0), 3)
    force_after = rng.choice([None, None, 0.0, 5.0, 30.0])
    return config, [{"t": at, "kind": "shutdown", "force_after": force_after}]


@attrs.frozen
class _Layout:
    """What every configuration of one scenario shares (reloads change the rest)."""

    providers: tuple[str, ...]
    repos: tuple[str, ...]
    agent_exclusive: bool
    idle: str
    sweep: str


def _draw_config(rng: random.Random, layout: _Layout, *, reload: bool = False) -> str:
    lines = ["[supervisor]", f'state_dir = "{STATE_DIR}"']
    if rng.random() < 0.5:
        lines.append(f"max_concurrency = {rng.randint(1, 4)}")
    lines += ["[scheduling]", f"agent_exclusive = {str(layout.agent_exclusive).lower()}"]
    lines += ["[retention]", f'idle = "{layout.idle}"', f'sweep_interval = "{layout.sweep}"']
    for provider in layout.providers:
        lines += [
            f"[providers.{provider}]",
            f'exec = ["{provider}"]',
            f"concurrency = {rng.randint(1, 3)}",
            f'idle_timeout = "{_idle_timeout(provider)}s"',
        ]
        for name in rng.choice([[], ["a"], ["a", "b"]]):
            lines += [f"[[providers.{provider}.accounts]]", f'name = "{name}"']
            if rng.random() < 0.5:
                lines.append(f"concurrency = {rng.randint(1, 2)}")
            if rng.random() < 0.3:
                lines += [f'window = "{rng.choice([60, 300])}s"', f"budget = {rng.randint(2, 5)}"]
    # A reload may drop a repository: its worktrees stay, swept like any other.
    repos = layout.repos[:-1] if reload and rng.random() < 0.3 else layout.repos
    for repo in repos:
        lines += ["[[repos]]", f'name = "{repo}"', f'path = "{REPOS_DIR}/{repo}"']
    return "\n".join(lines) + "\n"


def _idle_timeout(provider: str) -> int:
    """Each provider's idle timeout, fixed: a hang lasts exactly this long."""
    return 120 + 60 * PROVIDERS.index(provider)


def _draw_submit(rng: random.Random, t: float, number: int, layout: _Layout) -> dict[str, Any]:
    provider = rng.choice(layout.providers)
    run: dict[str, Any] = {"id": f"r{number:03d}", "provider": provider}
    conversation = rng.choice([None, *CONVERSATIONS])
    if conversation is not None:
        run["conversation"] = conversation
    agent = rng.choice([None, None, "a1", "a2"])
    if agent is not None:
        run["agent"] = agent
    run["workspace"] = rng.choice(WORKSPACES)
    attempts = []
    for _ in range(rng.choice([1, 1, 1, 2])):
        outcome = rng.choice(["succeeded"] * 6 + ["failed", "timed_out", "usage_limited"])
        attempt: dict[str, Any] = {
            "duration": float(rng.choice([1, 5, 30, 90, 240])),
            "outcome": outcome,
        }
        if outcome == "failed":
            attempt["exit_code"] = rng.choice([1, 2, -9])  # a provider that crashed
        if outcome == "timed_out":  # silent until the idle timeout stopped it
            attempt["duration"] = float(_idle_timeout(provider))
            attempt["exit_code"] = -15
        if outcome == "usage_limited":
            attempt["exit_code"] = 1
            if rng.random() < 0.7:
                attempt["resets_in"] = float(rng.choice([10, 60, 600]))
        attempts.append(attempt)
    return {
        "t": t,
        "kind": "submit",
        "run": run,
        "attempts": attempts,
        "dirty": rng.random() < 0.3,
        "on_busy": "skip" if rng.random() < 0.1 else "queue",
    }


def _draw_fault(rng: random.Random, t: float, ids: list[str], layout: _Layout) -> dict[str, Any]:
    kinds = ["cancel", "cancel", "reload", "reload", "git_failure", "disk_full", "crash"]
    if not layout.repos:
        # No repository, no git call: a git failure would never be met.
        kinds.remove("git_failure")
    kind = rng.choice(kinds)
    if kind == "cancel":
        # Mostly a storm: many runs at once, queued and running alike.
        many = rng.random() < 0.6
        chosen = rng.sample(ids, min(len(ids), rng.randint(3, 8) if many else 1))
        return {"t": t, "kind": "cancel", "run_ids": chosen}
    if kind == "reload":
        text = _draw_config(rng, layout, reload=True)
        if rng.random() < 0.4:
            old, new = rng.choice(SPOILERS)
            text = text.replace(old, new, 1) if old in text else text + "[broken\n"
        return {"t": t, "kind": "reload", "toml": text}
    if kind == "git_failure":
        return {"t": t, "kind": "git_failure", "operation": rng.choice(GIT_OPERATIONS)}
    if kind == "disk_full":
        return {"t": t, "kind": "disk_full", "seconds": float(rng.choice([5, 30, 120]))}
    return {"t": t, "kind": "crash"}


def _draw_link_faults(seed: int, end: float, layout: _Layout) -> list[dict[str, Any]]:
    """At most one link planted at a conversation's folder, one checkout swapped for a link."""
    rng = random.Random(f"links:{seed}")  # its own stream: see the module docstring
    events: list[dict[str, Any]] = []
    for kind in ("plant_link", "swap_checkout"):
        if rng.random() >= 0.3 or (kind == "swap_checkout" and not layout.repos):
            continue
        event: dict[str, Any] = {
            "t": round(rng.uniform(0.0, end + 60.0), 3),
            "kind": kind,
            "workspace": rng.choice(WORKSPACES),
            "conversation": rng.choice(CONVERSATIONS),
        }
        if kind == "swap_checkout":
            event["repo"] = rng.choice(layout.repos)
        events.append(event)
    return events
