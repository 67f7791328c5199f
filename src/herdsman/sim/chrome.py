"""The timeline in the Chrome trace event format, for Perfetto or chrome://tracing.

One process per provider, one thread per slot: a run takes the lowest slot
free when it starts, so the rows show how full each provider was.
"""

from __future__ import annotations

from typing import Any

from herdsman.sim.decisions import Timeline

__all__ = ["chrome_trace"]


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
        if decision.kind == "start":
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
