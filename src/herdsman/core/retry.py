"""Retries of transient failures: the classes of failure, a provider's policy, the backoff.

A run whose attempt failed for a transient reason (the provider overloaded,
a rate limit that named no reset, a dropped connection, ...) may be tried
again: the lifecycle (:mod:`herdsman.core.lifecycle`) asks the policy of the
run's provider whether this attempt's failure retries, and when. Everything
here is a plain function of its arguments: no clock, no randomness, so the
supervisor and the simulator decide alike and a replay decides again what
the run decided.

The jitter is deterministic: the fraction of the delay an attempt waits is
drawn from a BLAKE2b hash of the run id and the attempt number
(:func:`jitter_fraction`), so two runs that failed together spread out as
randomly drawn delays would, yet the same run and attempt always wait the
same.
"""

from __future__ import annotations

import enum
import hashlib

import attrs

__all__ = [
    "DEFAULT_RETRY_ON",
    "Failure",
    "RetryPolicy",
    "jitter_fraction",
]


class Failure(enum.StrEnum):
    """The class of a failed attempt, as a retry policy names it.

    The API classes carry the names the runner's stream readers give them
    (``herdsman.runtime.runner.api_failure``); the last two are the
    process's own ends.
    """

    OVERLOADED = "overloaded"
    """The provider is at capacity (HTTP 529)."""
    SERVER_ERROR = "server_error"
    """The provider failed (HTTP 5xx)."""
    RATE_LIMIT = "rate_limit"
    """Too many requests (HTTP 429), with no usage limit that names its reset."""
    CONNECTION = "connection"
    """No answer at all: the network, DNS, a dropped stream."""
    API_ERROR = "api_error"
    """Any other API error the stream reported (not a login, billing or request error)."""
    IDLE_TIMEOUT = "idle_timeout"
    """The agent said nothing for the provider's ``idle_timeout`` and was stopped."""
    CRASH = "crash"
    """The agent's process failed with no API failure in its stream."""


#: What a provider retries unless its configuration says otherwise: the
#: failures of the provider's side that a user who lost a fan-out to
#: 429/529 errors expects to be tried again.
DEFAULT_RETRY_ON = frozenset(
    {Failure.OVERLOADED, Failure.SERVER_ERROR, Failure.RATE_LIMIT, Failure.CONNECTION}
)


def jitter_fraction(run_id: str, attempt: int) -> float:
    """A fraction in [0, 1) that stands for a random draw, fixed by the run and attempt.

    The first 8 bytes of BLAKE2b over ``run_id``, a NUL and the attempt's
    number in decimal, read as a big-endian integer and divided by 2**64.
    """
    digest = hashlib.blake2b(f"{run_id}\0{attempt}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


@attrs.frozen
class RetryPolicy:
    """A provider's rule for trying a failed run again.

    ``attempts``: at most this many attempts of a run, the first included
    (1: never retried). ``on``: the failure classes that retry.
    ``after_work``: the classes among ``on`` that retry even when the agent
    may have done some of its work (it called a tool or finished a turn
    before the failure); every other class retries only an attempt that did
    nothing. ``backoff``: the delay before the second attempt (seconds), each
    later one doubling it up to ``backoff_max``; every delay is then
    jittered down to between half of it and all of it.
    """

    attempts: int = 1
    on: frozenset[Failure] = frozenset()
    after_work: frozenset[Failure] = frozenset()
    backoff: float = 30.0
    backoff_max: float = 600.0

    def retries(self, failure: Failure, attempt: int, *, worked: bool) -> bool:
        """Whether attempt number ``attempt`` (from 1), failed with ``failure``, is tried again."""
        if attempt >= self.attempts or failure not in self.on:
            return False
        return not worked or failure in self.after_work

    def delay(self, run_id: str, attempt: int) -> float:
        """Seconds to wait after attempt number ``attempt`` (from 1) failed.

        ``backoff * 2**(attempt - 1)``, at most ``backoff_max``, times a
        factor from 0.5 to 1 drawn by :func:`jitter_fraction`: never more
        than the cap, never less than half the undisturbed delay.
        """
        base = min(self.backoff_max, self.backoff * 2.0 ** min(attempt - 1, 64))
        return base * (0.5 + 0.5 * jitter_fraction(run_id, attempt))


#: A provider with no policy: nothing is ever retried.
NO_RETRIES = RetryPolicy()
