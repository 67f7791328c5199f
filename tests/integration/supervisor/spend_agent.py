"""A stand-in for Claude Code that replays a recorded stream, chosen by its account.

``python spend_agent.py RECORDS``

The account's home (``CLAUDE_CONFIG_DIR``) may hold a file ``stream`` naming
a case of tests/fixtures/agent_streams (``claude-usage-warning``,
``claude-standin-unauthorized``, ...); without one the run replays
``claude-standin-success``. The case's stdout and stderr are printed byte for
byte, and the process exits as the recorded CLI did. A case the real CLI did
not end by itself (``claude-standin-unauthorized`` was stopped in the middle
of its retries) is left running, as the real CLI would go on retrying: only
herdsman stops it, as is any case when the home holds a file ``hang``
(once printed, the run writes the file ``hanging`` there). Every run
appends the account's home, its run id and its argv as one JSON line to
``RECORDS``.

The dashboard's tests (tests/integration/dashboard/test_dashboard_accounts.py)
and docs/images/dashboard_screenshots.py run it too.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

STREAMS = Path(__file__).resolve().parents[2] / "fixtures" / "agent_streams"
#: How each recorded CLI ended: an exit code, or None if it was stopped from outside.
ENDINGS: dict[str, int | None] = {
    "claude-standin-success": 0,
    "claude-usage-warning": 0,
    "claude-not-logged-in": 1,
    "claude-standin-overloaded": 1,
    "claude-standin-unauthorized": None,
}


def main() -> int:
    records = Path(sys.argv[1])
    home = os.environ.get("CLAUDE_CONFIG_DIR", "")
    chosen = Path(home) / "stream" if home else None
    case = "claude-standin-success"
    if chosen is not None and chosen.exists():
        case = chosen.read_text().strip()
    sys.stdin.read()
    with records.open("a") as out:
        entry = {"home": home, "case": case, "run": os.environ.get("HERDSMAN_RUN_ID")}
        out.write(json.dumps({**entry, "argv": sys.argv[2:]}) + "\n")
    stdout, stderr = STREAMS / f"{case}.stdout", STREAMS / f"{case}.stderr"
    sys.stdout.buffer.write(stdout.read_bytes())
    sys.stdout.flush()
    if stderr.exists():
        sys.stderr.buffer.write(stderr.read_bytes())
        sys.stderr.flush()
    if home and (Path(home) / "hang").exists():
        (Path(home) / "hanging").write_text(os.environ.get("HERDSMAN_RUN_ID", ""))
        time.sleep(3600)  # said all it had to say, but not done: only herdsman stops it
        return 124
    ending = ENDINGS[case]
    if ending is None:
        time.sleep(3600)  # retrying for ever, as far as a test can tell
        return 124
    return ending


if __name__ == "__main__":
    sys.exit(main())
