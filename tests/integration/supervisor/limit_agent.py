"""A stand-in for Claude Code, Codex and plain CLIs that hits usage limits on demand.

``python limit_agent.py SHAPE RECORDS [resume args...]``

Every run appends what reached it (argv after RECORDS, the account-selecting
environment, the run id, and the reset it reports as unix seconds when
limited) as one JSON line to ``RECORDS``. The account's home
(``CLAUDE_CONFIG_DIR``, ``CODEX_HOME`` or ``AGENT_HOME``, by shape) may hold a
file ``limited`` with ``{"resets_in": seconds, "until": unix seconds or
null}``: while it is there (and ``until`` has not passed) the run prints the
usage-limit output of SHAPE, in the CLI's real format, and fails.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

HOME_VARIABLE = {"claude": "CLAUDE_CONFIG_DIR", "codex": "CODEX_HOME", "plain": "AGENT_HOME"}


def emit(obj: object) -> None:
    print(json.dumps(obj), flush=True)


def limited(home: str | None) -> dict[str, float] | None:
    if not home:
        return None
    marker = Path(home) / "limited"
    if not marker.exists():
        return None
    state: dict[str, float] = json.loads(marker.read_text())
    until = state.get("until")
    if until is not None and time.time() >= until:
        return None
    return state


def claude(shape: str, limit: dict[str, float] | None, resets: int, session: str) -> int:
    emit({"type": "system", "subtype": "init", "session_id": session, "tools": []})
    if limit is None:
        emit(
            {
                "type": "result",
                "subtype": "success",
                "is_error": False,
                "result": "done",
                "session_id": session,
            }
        )
        return 0
    if shape == "claude-event":
        emit(
            {
                "type": "rate_limit_event",
                "session_id": session,
                "rate_limit_info": {
                    "status": "rejected",
                    "resetsAt": resets,
                    "rateLimitType": "five_hour",
                    "overageStatus": "rejected",
                    "isUsingOverage": False,
                },
            }
        )
        text = "API Error: Request rejected (429)"
    elif shape == "claude-text":
        text = "You've hit your limit \u00b7 resets 8pm (Europe/Berlin)"
    else:  # claude-epoch, the older form
        text = f"Claude AI usage limit reached|{resets}"
    emit(
        {
            "type": "result",
            "subtype": "success",
            "is_error": True,
            "result": text,
            "session_id": session,
        }
    )
    return 1


def codex(shape: str, limit: dict[str, float] | None, session: str) -> int:
    emit({"type": "thread.started", "thread_id": session})
    emit({"type": "turn.started"})
    if limit is None:
        emit(
            {
                "type": "item.completed",
                "item": {"id": "i0", "type": "agent_message", "text": "done"},
            }
        )
        emit({"type": "turn.completed", "usage": {"input_tokens": 1, "output_tokens": 1}})
        return 0
    if shape == "codex-relative":
        message = (
            "You've hit your usage limit. Upgrade to Pro (https://openai.com/chatgpt/"
            "pricing) or try again in 5 days 22 hours 11 minutes."
        )
    else:  # codex-field: the error body as the server sent it
        message = json.dumps(
            {
                "error": {
                    "type": "usage_limit_reached",
                    "message": "The usage limit has been reached",
                    "resets_in_seconds": int(limit["resets_in"]),
                }
            }
        )
    emit({"type": "error", "message": message})
    emit({"type": "turn.failed", "error": {"message": message}})
    return 1


def plain(limit: dict[str, float] | None, resets: int) -> int:
    if limit is None:
        print("done", flush=True)
        return 0
    print(f"LIMIT resets_at={resets}", flush=True)
    return 1


def main() -> int:
    shape, records = sys.argv[1], Path(sys.argv[2])
    family = shape.split("-")[0]
    home = os.environ.get(HOME_VARIABLE[family])
    limit = limited(home)
    # The reset an epoch-printing shape reports, recorded too: a test checks
    # herdsman against it rather than against its own clock, later.
    resets = int(time.time() + limit["resets_in"]) if limit is not None else 0
    sys.stdin.read()
    run_id = os.environ.get("HERDSMAN_RUN_ID", "")
    with records.open("a", encoding="utf-8") as out:
        out.write(
            json.dumps(
                {
                    "run_id": run_id,
                    "args": sys.argv[3:],
                    "account": os.environ.get("HERDSMAN_ACCOUNT"),
                    "home": home,
                    "limited": limit is not None,
                    "resets_at": resets if limit is not None else None,
                }
            )
            + "\n"
        )
    session = f"sess-{Path(home).name if home else 'ambient'}-{run_id}"
    if family == "claude":
        return claude(shape, limit, resets, session)
    if family == "codex":
        return codex(shape, limit, session)
    return plain(limit, resets)


if __name__ == "__main__":
    sys.exit(main())
