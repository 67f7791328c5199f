"""From the configuration and run records to the scheduler core's inputs, and back to the trace.

Kept apart from the supervisor (and trio) so the fast simulation engine
(``herdsman.sim.engine``) derives limits and traces runs exactly as the
supervisor does, without importing it.
"""

from __future__ import annotations

from json.encoder import encode_basestring as _encode_string
from typing import Any

from herdsman.config import Config
from herdsman.config.model import Retry
from herdsman.core import Limits, RunRequest
from herdsman.core.lifecycle import Settings
from herdsman.core.retry import Failure, RetryPolicy
from herdsman.runtime.accounts import account_specs
from herdsman.runtime.store import NewRun, RunRecord

__all__ = [
    "limits_of",
    "retry_policy",
    "run_request",
    "settings_of",
    "trace_run",
    "trace_run_text",
]


def limits_of(config: Config) -> Limits:
    """The scheduler limits a config declares."""
    return Limits(
        {name: p.concurrency for name, p in config.providers.items()},
        config.supervisor.max_concurrency,
    )


def settings_of(config: Config) -> Settings:
    """What a config says about the rules of a run's life, as the lifecycle core takes it."""
    return Settings(
        limits_of(config),
        agent_exclusive=config.scheduling.agent_exclusive,
        accounts={name: tuple(account_specs(p)) for name, p in config.providers.items()},
        checkouts=bool(config.repos),
        # A fleet member retries nothing yet: the ledger would let another
        # member start the run before its backoff ends (docs/operations.md).
        retries={}
        if config.fleet.enabled
        else {name: retry_policy(p.retry) for name, p in config.providers.items()},
    )


def retry_policy(retry: Retry) -> RetryPolicy:
    """A provider's ``[retry]`` table as the lifecycle core takes it."""
    return RetryPolicy(
        retry.attempts,
        frozenset(Failure(name) for name in retry.on),
        frozenset(Failure(name) for name in retry.after_work),
        retry.backoff.total_seconds(),
        retry.backoff_max.total_seconds(),
    )


def run_request(record: RunRecord | NewRun) -> RunRequest:
    """The scheduler's view of a run."""
    return RunRequest(
        record.id, record.provider, record.conversation, record.agent, record.workspace, record.cwd
    )


def trace_run(record: RunRecord | NewRun, *, with_prompt: bool) -> dict[str, Any]:
    """The ``run`` object of a submit or skip trace event."""
    out: dict[str, Any] = {"id": record.id, "provider": record.provider}
    if record.conversation is not None:
        out["conversation"] = record.conversation
    if record.agent is not None:
        out["agent"] = record.agent
    out["workspace"] = record.workspace
    if record.cwd is not None:
        out["cwd"] = record.cwd
    if with_prompt:
        out["prompt"] = record.prompt
    return out


def trace_run_text(record: RunRecord | NewRun, *, with_prompt: bool) -> str:
    """``trace_run``'s object as a trace line writes it, composed without the dict.

    The trace's encoder writes each field in order, no spaces, non-ASCII as
    it is: each value is a str (or a None left out) and written as such.
    Part of the trace lines composed by hand (``herdsman.trace.event_line``
    says what they save the replay); a hypothesis test holds it to the
    encoder's bytes.
    """
    text = '{"id":' + _encode_string(record.id) + ',"provider":' + _encode_string(record.provider)
    if record.conversation is not None:
        text += ',"conversation":' + _encode_string(record.conversation)
    if record.agent is not None:
        text += ',"agent":' + _encode_string(record.agent)
    text += ',"workspace":' + _encode_string(record.workspace)
    if record.cwd is not None:
        text += ',"cwd":' + _encode_string(record.cwd)
    if with_prompt:
        text += ',"prompt":' + _encode_string(record.prompt)
    return text + "}"
