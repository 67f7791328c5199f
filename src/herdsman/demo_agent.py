"""A stand-in agent CLI: reads a prompt on stdin, waits, replies.

``python -m herdsman.demo_agent [--delay SECONDS] [--protocol plain|claude]
[--fail] [--overloaded N] [--spawn-grandchild] [--rate-limit-warning]``

It lets the example config, the tests and a first try of herdsman run
without any real agent CLI installed. The delay defaults to 1 second, or to
``HERDSMAN_DEMO_DELAY`` when set; ``--delay`` wins over both. With
``--protocol claude`` it prints the shape Claude Code prints with
``--output-format stream-json --verbose``: a ``system``/``init`` line with a
session id, then a ``result`` line with what the run spent, as Claude Code
reports it (tokens from the prompt's and the reply's length, at a made-up
price). ``--rate-limit-warning`` adds a ``rate_limit_event`` saying the
account is near its five-hour limit. ``--fail`` makes it exit with code 1
after reporting an error. ``--overloaded N`` (with ``--protocol claude``)
fails a run's first N attempts as Claude Code fails when the API answers
every request 529 (overloaded): its ``api_retry`` lines, its
``server_error`` message and an ``is_error`` result, exit code 1; the
attempt number is ``HERDSMAN_ATTEMPT``, which herdsman sets (1 when unset).
``--spawn-grandchild`` first starts a process that sleeps for an hour
holding stdout and stderr open, and prints its pid on stderr, so tests can
check that the whole process group is stopped.

It imports only the standard library's light modules, so it starts fast.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

DELAY_ENV = "HERDSMAN_DEMO_DELAY"
ATTEMPT_ENV = "HERDSMAN_ATTEMPT"
#: What Claude Code says when the API stayed overloaded through its own retries.
OVERLOADED = (
    "API Error: Repeated 529 Overloaded errors. The API is at capacity — this is usually"
    " temporary. Try again in a moment."
)


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="herdsman-demo-agent",
        description="A stand-in agent CLI that ships with herdsman: it reads a prompt on stdin,"
        " waits, and replies, so herdsman can be tried with no agent CLI installed.",
    )
    parser.add_argument(
        "--delay",
        type=float,
        default=None,
        help=f"seconds to wait (default: ${DELAY_ENV}, else 1)",
    )
    parser.add_argument(
        "--protocol",
        choices=("plain", "claude"),
        default="plain",
        help="plain: the reply as text (default); claude: Claude Code's stream-json lines,"
        ' with what the run spent (use with protocol = "claude" in supervisor.toml)',
    )
    parser.add_argument("--fail", action="store_true", help="report an error and exit 1")
    parser.add_argument(
        "--overloaded",
        type=_attempts,
        default=0,
        metavar="N",
        help="with --protocol claude: fail the first N attempts of a run (HERDSMAN_ATTEMPT)"
        " as Claude Code does when the API is overloaded (HTTP 529), so retries can be tried",
    )
    parser.add_argument(
        "--spawn-grandchild", action="store_true", help="start a long-sleeping grandchild"
    )
    parser.add_argument(
        "--rate-limit-warning",
        action="store_true",
        help="with --protocol claude: say the account is near its limit",
    )
    args = parser.parse_args(argv)
    if args.overloaded and args.protocol != "claude":
        parser.error("--overloaded needs --protocol claude: only that stream can say it")
    if args.delay is None:
        written = os.environ.get(DELAY_ENV, "1")
        try:
            args.delay = float(written)
        except ValueError:
            parser.error(f"${DELAY_ENV} must be a number of seconds, got {written!r}")
    return args


def _attempts(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a number of attempts, 0 or more, got {text!r}")
    return value


def _attempt() -> int:
    """Which attempt of its run this is: ``HERDSMAN_ATTEMPT``, else 1 (run by hand)."""
    try:
        return max(1, int(os.environ.get(ATTEMPT_ENV, "1")))
    except ValueError:
        return 1


def _spawn_grandchild() -> int:
    # fork keeps this module free of the subprocess import; the grandchild
    # inherits stdout/stderr, so it also holds the run's pipes open.
    pid = os.fork()
    if pid == 0:
        try:
            time.sleep(3600)
        finally:
            os._exit(0)
    return pid


def _emit(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _spent(prompt: str, reply: str, delay: float) -> dict[str, object]:
    """The result line's figures, in Claude Code's shape: about four characters a token."""
    tokens = {"input_tokens": len(prompt) // 4 + 1, "output_tokens": len(reply) // 4 + 1}
    cost = round((tokens["input_tokens"] * 3 + tokens["output_tokens"] * 15) / 1e6, 6)
    return {
        "duration_ms": round(delay * 1000),
        "duration_api_ms": round(delay * 1000),
        "total_cost_usd": cost,
        "usage": {**tokens, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0},
        "modelUsage": {
            "demo": {
                "inputTokens": tokens["input_tokens"],
                "outputTokens": tokens["output_tokens"],
                "cacheReadInputTokens": 0,
                "cacheCreationInputTokens": 0,
                "costUSD": cost,
            }
        },
        "terminal_reason": "completed",
    }


def _rate_limit_warning(session_id: str) -> dict[str, object]:
    """A ``rate_limit_event``: near the five-hour limit, which resets in an hour."""
    info = {
        "status": "allowed_warning",
        "resetsAt": int(time.time()) + 3600,
        "rateLimitType": "five_hour",
        "utilization": 0.9,
        "isUsingOverage": False,
    }
    return {"type": "rate_limit_event", "rate_limit_info": info, "session_id": session_id}


def _overloaded(session_id: str, spent: dict[str, object]) -> int:
    """Print what Claude Code prints when every API request is answered 529; its exit code.

    The shapes are those of a recorded Claude Code 2.1 stream: two
    ``api_retry`` lines (``error: "overloaded"``, ``error_status: 529``),
    an assistant message carrying ``error: "server_error"``, then an
    ``is_error`` result whose ``subtype`` still says ``success``.
    """
    for attempt, delay_ms in ((1, 564.8), (2, 1157.8)):
        retry = {
            "type": "system",
            "subtype": "api_retry",
            "attempt": attempt,
            "max_retries": 10,
            "retry_delay_ms": delay_ms,
            "error_status": 529,
            "error": "overloaded",
            "session_id": session_id,
        }
        _emit(json.dumps(retry))
    message = {
        "model": "<synthetic>",
        "role": "assistant",
        "type": "message",
        "content": [{"type": "text", "text": OVERLOADED}],
    }
    assistant = {
        "type": "assistant",
        "message": message,
        "session_id": session_id,
        "error": "server_error",
    }
    _emit(json.dumps(assistant))
    result = {
        "type": "result",
        "subtype": "success",
        "is_error": True,
        "result": OVERLOADED,
        "session_id": session_id,
        "num_turns": 1,
        **spent,
    }
    _emit(json.dumps(result))
    return 1


def main(argv: list[str] | None = None) -> int:
    """Run the demo agent; returns the exit code."""
    args = _parse(sys.argv[1:] if argv is None else argv)
    delay: float = args.delay
    prompt = sys.stdin.buffer.read().decode("utf-8", errors="replace")
    # The last line: a preamble herdsman adds goes before the user's words.
    lines = [line for line in prompt.splitlines() if line.strip()]
    last_line = lines[-1] if lines else ""
    session_id = "demo-" + os.urandom(8).hex()
    if args.spawn_grandchild:
        sys.stderr.write(f"demo agent: grandchild pid {_spawn_grandchild()}\n")
        sys.stderr.flush()
    if args.protocol == "claude":
        _emit(
            json.dumps(
                {
                    "type": "system",
                    "subtype": "init",
                    "session_id": session_id,
                    "model": "demo",
                    "tools": [],
                }
            )
        )
    time.sleep(max(delay, 0.0))
    if args.protocol == "claude" and _attempt() <= args.overloaded:
        # What the attempt spent before the API failed: the prompt read, no reply.
        return _overloaded(session_id, _spent(prompt, "", delay))
    reply = f"demo reply: {last_line}"
    error = "demo agent: failing as asked (--fail)"
    if args.protocol == "claude":
        if args.rate_limit_warning:
            _emit(json.dumps(_rate_limit_warning(session_id)))
        result = {
            "type": "result",
            "subtype": "error_during_execution" if args.fail else "success",
            "is_error": args.fail,
            "result": error if args.fail else reply,
            "session_id": session_id,
            "num_turns": 1,
            **_spent(prompt, reply, delay),
        }
        _emit(json.dumps(result))
    elif args.fail:
        sys.stderr.write(f"Error: {error}\n")
    else:
        _emit(reply)
    return 1 if args.fail else 0


if __name__ == "__main__":
    sys.exit(main())
