"""The timeline in the Chrome trace event format, for Perfetto or chrome://tracing.

One process per provider, one thread per slot: a run takes the lowest slot
free when it starts, so the rows show how full each provider was. A retry,
an account marked near its limit and a refused login are instants on their
provider's row, with what was decided.
"""

from __future__ import annotations

from typing import Any

from herdsman.sim.decisions import Timeline

__all__ = ["MARKS", "chrome_trace"]

#: Decisions shown as instants on their provider's row.
MARKS = frozenset({"retry", "near_limit", "needs_login"})


def chrome_trace(timeline: Timeline) -> dict[str, Any]:
    """``{"traceEvents": [...]}`` for ``timeline``."""
    providers = timeline.providers
    names = sorted(set(providers.values()))
    pid = {name: number for number, name in enumerate(names, start=1)}
    events: list[dict[str, Any]] = [
        {"name": "process_name", "ph": "M", "pid": pid[name], "args": {"name": name}}
        for name in names
    ]
    busy: dict[str, list[bool]] = {name: [] for name in names}
    open_runs: dict[str, tuple[float, int, str | None]] = {}
    for decision in timeline.decisions:
        provider = providers.get(decision.run_id)
        if provider is None:
            continue
        slots = busy[provider]
        if decision.kind in MARKS:
            events.append(
                {
                    "name": f"{decision.kind} {decision.run_id}",
                    "ph": "i",
                    "s": "p",
                    "pid": pid[provider],
                    "ts": round(decision.t * 1e6),
                    "args": dict(decision.what),
                }
            )
        elif decision.kind == "start":
            slot = next((i for i, used in enumerate(slots) if not used), len(slots))
            if slot == len(slots):
                slots.append(True)
                events.append(
                    {
                        "name": "thread_name",
                        "ph": "M",
                        "pid": pid[provider],
                        "tid": slot,
                        "args": {"name": f"slot {slot}"},
                    }
                )
            slots[slot] = True
            account = dict(decision.what).get("account")
            open_runs[decision.run_id] = (decision.t, slot, account)
        elif decision.kind == "finish" and decision.run_id in open_runs:
            began, slot, account = open_runs.pop(decision.run_id)
            slots[slot] = False
            events.append(
                {
                    "name": decision.run_id,
                    "ph": "X",
                    "pid": pid[provider],
                    "tid": slot,
                    "ts": round(began * 1e6),
                    "dur": round((decision.t - began) * 1e6),
                    "args": {
                        "conversation": timeline.conversations.get(decision.run_id),
                        "account": account,
                        "outcome": dict(decision.what).get("outcome"),
                    },
                }
            )
    return {"traceEvents": events, "displayTimeUnit": "ms"}
