"""What a run spent and what the provider said about it, as read from the agent's stream.

:class:`RunUsage` is one frozen value per run: tokens by kind, the cost in
US dollars when the stream states it, the same per model, turns and API
time; and the provider's signals that later rules act on: an account near
its limit (:class:`RateLimitWarning`), the class of the API failure the run
met (:class:`ApiFailure`, which also says when the account needs a login),
and the last API retry the agent made (:class:`ApiRetry`). The protocol
adapters build it (``claude_usage.py``, ``codex_usage.py``); the runner
hands it on in ``ProcessOutcome.usage``. It decides nothing by itself.

Everything here is read leniently: a field that is missing, of the wrong
type or negative is left out, never guessed and never an error.
"""

from __future__ import annotations

import math
from typing import Final

import attrs

from herdsman.runtime.runner.api_failure import ApiFailure

__all__ = [
    "ApiRetry",
    "ModelUsage",
    "RateLimitWarning",
    "RunUsage",
    "Tokens",
    "count",
    "fraction",
    "instant",
    "seconds",
    "tokens_text",
    "usd",
]


@attrs.frozen
class Tokens:
    """Tokens by kind. The kinds are disjoint: :attr:`total` is what the run consumed.

    ``input`` is input read fresh, ``cache_read`` input served from the
    provider's prompt cache, ``cache_write`` input written to it, ``output``
    what the model wrote. ``reasoning`` is the part of ``output`` spent
    reasoning (only Codex says it); it is not added again to the total.
    """

    input: int = 0
    cache_read: int = 0
    cache_write: int = 0
    output: int = 0
    reasoning: int = 0

    @property
    def total(self) -> int:
        """Every token the run consumed, of every kind."""
        return self.input + self.cache_read + self.cache_write + self.output

    @property
    def budgeted(self) -> int:
        """The tokens a ``tokens`` budget counts: input, cache writes and output.

        Cache reads are left out. An agent re-reads its whole context from
        the provider's cache at every turn, so they grow with the length of
        the conversation times its turns rather than with the work asked
        for; providers price them at a tenth of fresh input and leave them
        out of their input-token rate limits (Anthropic). Counting them would
        make a budget spend itself on long sessions. Who wants to hold the
        money a run costs counts ``usd`` instead.
        """
        return self.input + self.cache_write + self.output

    def __add__(self, other: Tokens) -> Tokens:
        return Tokens(
            input=self.input + other.input,
            cache_read=self.cache_read + other.cache_read,
            cache_write=self.cache_write + other.cache_write,
            output=self.output + other.output,
            reasoning=self.reasoning + other.reasoning,
        )


@attrs.frozen
class ModelUsage:
    """What one model consumed in the run, and its cost when the stream states it."""

    model: str
    tokens: Tokens
    cost_usd: float | None = None


@attrs.frozen
class RateLimitWarning:
    """The provider said the account is near a limit (``allowed_warning``), not over it.

    ``resets_at`` (unix seconds) is when the limit's window ends, if the
    stream said; ``limit_type`` which window (``five_hour``, ``seven_day``,
    ...); ``utilization`` the fraction of it used, if the stream said.
    """

    resets_at: float | None
    limit_type: str | None
    utilization: float | None = None


@attrs.frozen
class ApiRetry:
    """One retry of an API request the agent made by itself, as its stream reported it.

    ``attempt`` of ``max_retries``; ``delay`` the seconds it waited before
    it; ``status`` the HTTP status that failed; ``failure`` its class.
    """

    attempt: int | None
    max_retries: int | None
    delay: float | None
    status: int | None
    failure: ApiFailure | None


@attrs.frozen
class RunUsage:
    """What one run spent, and what its provider said, read from the agent's stream.

    ``tokens`` is None when the stream gave no counts. ``partial``: the
    stream ended without its closing figures, and ``tokens`` is what the
    messages seen so far reported (a lower bound; no cost). ``session_totals``:
    the counts are the session's running totals (Codex reports them so), so
    a resumed session's run includes what earlier runs of it spent.
    ``cost_usd`` is the provider's own figure, never computed here.
    ``models`` is sorted by model name. ``duration`` and ``api_time`` are
    seconds, as the agent measured them. ``terminal_reason`` is Claude
    Code's word on why the session ended.

    The signals: ``near_limit`` when the provider warned that the account is
    near a limit (the last rate-limit event seen said so); ``failure`` the
    class of the API failure the run ended with (None when it succeeded or
    met none); ``retries`` how many API retries the agent reported, and
    ``last_retry`` the last of them.
    """

    tokens: Tokens | None = None
    cost_usd: float | None = None
    models: tuple[ModelUsage, ...] = ()
    turns: int | None = None
    duration: float | None = None
    api_time: float | None = None
    terminal_reason: str | None = None
    partial: bool = False
    session_totals: bool = False
    near_limit: RateLimitWarning | None = None
    failure: ApiFailure | None = None
    retries: int = 0
    last_retry: ApiRetry | None = None

    @property
    def needs_login(self) -> bool:
        """Whether the run failed because the account is not logged in (or was refused)."""
        return self.failure is ApiFailure.AUTHENTICATION

    @property
    def empty(self) -> bool:
        """Whether the stream said nothing of what is held here."""
        return self == EMPTY


EMPTY: Final = RunUsage()


def tokens_text(tokens: Tokens) -> str:
    """``1,234 input · 4,096 cache read · 56 output``: the kinds that are not zero."""
    parts = [
        f"{amount:,} {label}"
        for amount, label in (
            (tokens.input, "input"),
            (tokens.cache_read, "cache read"),
            (tokens.cache_write, "cache write"),
            (tokens.output, "output"),
            (tokens.reasoning, "of it reasoning"),
        )
        if amount
    ]
    return " · ".join(parts) or "none"


def count(value: object) -> int | None:
    """``value`` as a token count: a non-negative whole number, else None.

    A JSON bool is no count; a float with no fraction (``12.0``) is one.
    """
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value >= 0 else None
    if isinstance(value, float) and value.is_integer() and value >= 0:
        return int(value)
    return None


def _finite(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if math.isfinite(number) and number >= 0 else None


def usd(value: object) -> float | None:
    """``value`` as an amount in dollars: a finite non-negative number, else None."""
    return _finite(value)


def seconds(milliseconds: object) -> float | None:
    """A stream's milliseconds as seconds: finite and non-negative, else None."""
    amount = _finite(milliseconds)
    return None if amount is None else amount / 1000


def instant(value: object) -> float | None:
    """``value`` as unix seconds: a finite non-negative number, else None."""
    return _finite(value)


def fraction(value: object) -> float | None:
    """``value`` as a fraction used, 0 to 1, else None."""
    number = _finite(value)
    return number if number is not None and number <= 1 else None
