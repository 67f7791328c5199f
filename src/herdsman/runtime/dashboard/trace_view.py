"""``herdsman sim view TRACE``: a trace's runs in the dashboard's timeline, as one HTML file.

The file holds its data, the timeline's script and the style sheet: it opens
from disk in any browser, offline, and can be sent to someone. A recorded
trace (the state directory's ``traces/``) and a replay's output (``sim
replay --out``) both have the starts and finishes it draws; a synthetic
workload from ``sim generate`` has only submits until it is replayed.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from herdsman.trace import TraceEvent

#: Outcomes that are drawn in the failure colour.
_FAILED = {"failed", "timed_out", "usage_limited", "lost"}


def _run(fields: Mapping[str, Any], at: float) -> dict[str, Any]:
    return {
        "id": fields["id"],
        "provider": fields["provider"],
        "conversation": fields.get("conversation") or fields["id"],
        "workspace": fields.get("workspace") or "default",
        "status": "queued",
        "submitted_at": at,
        "started_at": None,
        "finished_at": None,
        "account": None,
        "reason": None,
    }


def trace_runs(
    started_at: float, carry: Mapping[str, Any] | None, events: Iterable[TraceEvent]
) -> tuple[list[dict[str, Any]], float]:
    """Each run of the trace as the dashboard lists runs, and the time of the last event.

    A usage-limited run that went back to its queue is drawn as the attempt
    that hit the limit, then the run again from its requeueing on.
    """
    runs: dict[str, dict[str, Any]] = {}
    attempts: list[dict[str, Any]] = []
    last = started_at
    for held in (carry or {}).get("running", []):
        run = runs[held["run"]["id"]] = _run(held["run"], started_at)
        run.update(status="running", started_at=started_at, account=held.get("account"))
    for queued in (carry or {}).get("queued", []):
        runs[queued["id"]] = _run(queued, started_at)
    for event in events:
        at = started_at + event.t
        last = max(last, at)
        fields = event.fields
        if event.event == "submit":
            runs[fields["run"]["id"]] = _run(fields["run"], at)
            continue
        if event.event == "skip":
            skipped = runs[fields["run"]["id"]] = _run(fields["run"], at)
            skipped.update(status="skipped", finished_at=at, reason="skipped: the lane was busy")
            continue
        found = runs.get(fields.get("run_id", ""))
        if found is None:
            continue
        run = found
        if event.event == "start":
            run.update(status="running", started_at=at, account=fields.get("account"))
        elif event.event == "finish":
            outcome = fields.get("outcome", "failed")
            if fields.get("requeued"):
                attempts.append(
                    {
                        **run,
                        "id": f"{run['id']} (limited)",
                        "status": "failed",
                        "finished_at": at,
                        # An attempt of a run listed on its own: not counted as a run.
                        "limited": True,
                    }
                )
                run.update(status="queued", submitted_at=at, started_at=None)
                continue
            status = "failed" if outcome in _FAILED else outcome
            run.update(status=status, finished_at=at, reason=outcome)
        elif event.event in ("cancel", "lost"):
            status = "cancelled" if event.event == "cancel" else "lost"
            run.update(status=status, finished_at=at, reason=event.event)
    return [*runs.values(), *attempts], last


def view_html(path: Path) -> str:
    """The self-contained HTML page of the trace at ``path``."""
    # Imported here: every `herdsman` command builds the parser this module adds to.
    import html  # noqa: PLC0415

    from herdsman.runtime.dashboard.assets import STATIC  # noqa: PLC0415
    from herdsman.trace import read_trace  # noqa: PLC0415

    header, events = read_trace(path)
    started_at = dt.datetime.fromisoformat(header.started_at.replace("Z", "+00:00")).timestamp()
    runs, last = trace_runs(started_at, header.carry, events)
    data = {"runs": runs, "since": started_at, "until": last}
    # Inside a <script> element, "</" would end it: JSON allows "<\/".
    payload = json.dumps(data, separators=(",", ":")).replace("</", "<\\/")
    page = (STATIC / "trace.html").read_text(encoding="utf-8")
    for key, value in (
        ("title", html.escape(path.name)),
        ("style", (STATIC / "style.css").read_text(encoding="utf-8")),
        ("timeline", (STATIC / "timeline.js").read_text(encoding="utf-8")),
        ("data", payload),
    ):
        page = page.replace("{{" + key + "}}", value)
    return page


def _view(args: argparse.Namespace) -> int:
    args.out.write_text(view_html(args.trace), encoding="utf-8")
    print(f"wrote {args.out}: open it in a browser")
    return 0


def add_view_command(actions: Any, guarded: Callable[[Any], Any]) -> None:
    """Add ``sim view TRACE --out FILE.html``."""
    view = actions.add_parser(
        "view",
        help="draw a trace's runs on the dashboard's timeline, in one HTML file",
        description="Write a self-contained HTML page showing the trace's runs as the"
        " dashboard's timeline does: per provider slot or per conversation, coloured by"
        " outcome, waits visible (see docs/dashboard.md).",
    )
    view.add_argument("trace", type=Path, help="a trace file (recorded, or a replay's --out)")
    view.add_argument("--out", "-o", type=Path, required=True, help="the HTML file to write")
    view.set_defaults(handler=guarded(_view))
