"""Write sim/team-day.jsonl: a synthetic working day of a small team, seeded.

Three providers (Claude Code on two accounts with quotas, Codex, a local
model), one repository, eight people's conversations with follow-ups, agents
shared between them, a few usage limits and failures, cancels, and a
configuration reload at lunch (Claude's concurrency goes from 2 to 3).

    .venv/bin/python sim/make_team_day.py      # then: python sim/regenerate.py
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from herdsman.config import load_config_text
from herdsman.config.report import config_as_json

HERE = Path(__file__).parent

CONFIG = """\
[supervisor]
state_dir = "/team/state"
max_concurrency = 5

[providers.claude]
exec = ["claude", "-p", "--output-format", "stream-json", "--verbose"]
protocol = "claude"
concurrency = 2
resume_args = ["--resume", "{session}"]

[[providers.claude.accounts]]
name = "team"
env = { CLAUDE_CONFIG_DIR = "/team/claude-team" }
window = "5h"
budget = 60
concurrency = 2

[[providers.claude.accounts]]
name = "spare"
env = { CLAUDE_CONFIG_DIR = "/team/claude-spare" }
window = "5h"
budget = 600
budget_unit = "run_minutes"

[providers.codex]
exec = ["codex", "exec", "--json", "-"]
protocol = "codex"
concurrency = 2

[providers.local]
exec = ["llm-agent"]
concurrency = 1

[[repos]]
name = "app"
path = "/team/repos/app"
"""


def config_json(text: str) -> dict[str, object]:
    loaded = load_config_text(text, Path("/team/supervisor.toml"), environ={})
    return config_as_json(loaded.config)


def main() -> None:
    rng = random.Random(20261129)
    people = [f"p{n}" for n in range(8)]
    events: list[dict[str, object]] = []
    run = 0
    for person in people:
        t = rng.uniform(0, 3600)  # arrives within the first hour of the day
        conversations = 0
        while t < 8 * 3600:
            conversations += 1
            conversation = f"{person}-c{conversations}"
            provider = rng.choices(["claude", "codex", "local"], [6, 3, 1])[0]
            for _turn in range(rng.randint(1, 5)):
                body: dict[str, object] = {
                    "id": f"run-{run:04d}",
                    "provider": provider,
                    "conversation": conversation,
                    "workspace": "team",
                }
                if rng.random() < 0.25:
                    body["agent"] = rng.choice(["reviewer", "tester"])
                outcome = rng.choices(
                    ["succeeded", "failed", "usage_limited", "timed_out"], [90, 5, 4, 1]
                )[0]
                duration = round(min(3600.0, rng.lognormvariate(5.5, 0.9)), 1)
                events.append(
                    {
                        "t": round(t, 3),
                        "event": "submit",
                        "run": body,
                        "duration": duration,
                        "outcome": outcome,
                    }
                )
                if rng.random() < 0.02:
                    events.append({"t": round(t + 30, 3), "event": "cancel", "run_id": body["id"]})
                run += 1
                t += duration + rng.expovariate(1 / 300)  # reads the answer, thinks
            t += rng.expovariate(1 / 1800)  # other work before the next task
    lunch = config_json(
        CONFIG.replace("concurrency = 2\nresume_args", "concurrency = 3\nresume_args")
    )
    events.append({"t": 4 * 3600.0, "event": "reload", "generation": 2, "config": lunch})
    events.sort(key=lambda e: (e["t"], e["event"] != "reload"))
    header = {
        "herdsman_trace": 1,
        "started_at": "2026-11-30T08:00:00.000000Z",
        "config": config_json(CONFIG),
    }
    lines = [json.dumps(header)]
    for seq, event in enumerate(events):
        lines.append(json.dumps({"t": event["t"], "seq": seq, **event}))
    (HERE / "team-day.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"wrote {len(events)} events ({run} runs) to sim/team-day.jsonl")


if __name__ == "__main__":
    main()
