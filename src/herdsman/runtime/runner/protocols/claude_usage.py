"""Reading what a Claude Code run spent, and what the API said, from its stream-json.

The figures come from the final ``result`` line: ``total_cost_usd``,
``usage`` (``input_tokens``, ``cache_read_input_tokens``,
``cache_creation_input_tokens``, ``output_tokens``; its ``input_tokens``
counts only input read fresh, so the kinds add up), ``modelUsage`` (per
model ``inputTokens``, ``cacheReadInputTokens``,
``cacheCreationInputTokens``, ``outputTokens``, ``costUSD``), ``num_turns``,
``duration_ms``, ``duration_api_ms``, ``terminal_reason`` and, on an error,
``api_error_status``. Without a result line (a run stopped, a stream cut)
the tokens are summed from the assistant messages seen, the last ``usage``
of each message id: a lower bound, since Claude Code prints a message
before its final output count.

The signals: ``rate_limit_event`` lines (the last one's
``rate_limit_info.status`` ``allowed_warning`` is a warning, with
``resetsAt``, ``rateLimitType`` and ``utilization``; ``allowed`` lifts it),
``system``/``api_retry`` lines (``attempt``, ``max_retries``,
``retry_delay_ms``, ``error_status``, ``error``) and an assistant message's
``error`` (``authentication_failed`` when not logged in). The failure is the
last one the stream reported, in stream order; a real answer of the API (an
assistant message of a model) clears it, and a run that succeeded has none.
"""

from __future__ import annotations

from typing import Any, Final

import attrs

from herdsman.runtime.runner.api_failure import (
    ApiFailure,
    failure_of_name,
    failure_of_status,
    failure_of_text,
)
from herdsman.runtime.runner.protocols.base import text_of
from herdsman.runtime.runner.run_usage import (
    ApiRetry,
    ModelUsage,
    RateLimitWarning,
    RunUsage,
    Tokens,
    count,
    fraction,
    instant,
    seconds,
    usd,
)

SYNTHETIC_MODEL: Final = "<synthetic>"
"""The model Claude Code names on a message it made up itself (an error), not the API's."""


def _tokens(usage: object, *, fresh: str, read: str, write: str, output: str) -> Tokens | None:
    """The counts under the four keys of ``usage``; None when none of them can be read."""
    if not isinstance(usage, dict):
        return None
    counts = [count(usage.get(key)) for key in (fresh, read, write, output)]
    if all(value is None for value in counts):
        return None
    fresh_n, read_n, write_n, output_n = (value or 0 for value in counts)
    return Tokens(input=fresh_n, cache_read=read_n, cache_write=write_n, output=output_n)


def result_tokens(usage: object) -> Tokens | None:
    """A ``result`` line's (or a message's) ``usage`` as tokens."""
    return _tokens(
        usage,
        fresh="input_tokens",
        read="cache_read_input_tokens",
        write="cache_creation_input_tokens",
        output="output_tokens",
    )


def model_usage(per_model: object) -> tuple[ModelUsage, ...]:
    """A ``result`` line's ``modelUsage``, sorted by model; entries not readable left out."""
    if not isinstance(per_model, dict):
        return ()
    models: list[ModelUsage] = []
    for name in sorted(key for key in per_model if isinstance(key, str) and key):
        entry = per_model[name]
        tokens = _tokens(
            entry,
            fresh="inputTokens",
            read="cacheReadInputTokens",
            write="cacheCreationInputTokens",
            output="outputTokens",
        )
        cost = usd(entry.get("costUSD")) if isinstance(entry, dict) else None
        if tokens is not None or cost is not None:
            models.append(ModelUsage(model=name, tokens=tokens or Tokens(), cost_usd=cost))
    return tuple(models)


def retry_of(event: dict[str, Any]) -> ApiRetry:
    """An ``api_retry`` line as an :class:`ApiRetry`; fields that cannot be read are None."""
    status = count(event.get("error_status"))
    name = text_of(event.get("error"))
    failure = failure_of_name(name) if name is not None else None
    # Claude Code names the class, except that it calls a 529 a server_error in
    # places; without a name the status says it, and with neither no answer came.
    if status is not None and (failure is None or status == 529):
        failure = failure_of_status(status)
    elif failure is None:
        failure = ApiFailure.CONNECTION
    return ApiRetry(
        attempt=count(event.get("attempt")),
        max_retries=count(event.get("max_retries")),
        delay=seconds(event.get("retry_delay_ms")),
        status=status,
        failure=failure,
    )


class ClaudeUsageReader:
    """Collects a Claude Code run's usage and signals, one event at a time."""

    def __init__(self) -> None:
        self._result: RunUsage | None = None
        # Message id -> (model, usage): the last usage each message reported.
        self._messages: dict[str, tuple[str, object]] = {}
        self._near_limit: RateLimitWarning | None = None
        self._failure: ApiFailure | None = None
        self._retries = 0
        self._last_retry: ApiRetry | None = None

    def on_rate_limit(self, info: object) -> None:
        """A ``rate_limit_event``'s ``rate_limit_info``: a warning, or its end."""
        if not isinstance(info, dict):
            return
        status = info.get("status")
        if status == "allowed_warning":
            self._near_limit = RateLimitWarning(
                resets_at=instant(info.get("resetsAt")),
                limit_type=text_of(info.get("rateLimitType")),
                utilization=fraction(info.get("utilization")),
            )
        elif status == "allowed":
            self._near_limit = None

    def on_retry(self, event: dict[str, Any]) -> ApiRetry:
        """A ``system``/``api_retry`` line; the retry it reports."""
        retry = retry_of(event)
        self._retries += 1
        self._last_retry = retry
        self._failure = retry.failure
        return retry

    def on_assistant(self, event: dict[str, Any], error: str | None, text: str | None) -> None:
        """An assistant message: its usage, or the error Claude Code reports in it."""
        if error is not None:
            failure = failure_of_name(error)
            if failure is None and error == "unknown" and text is not None:
                failure = failure_of_text(text)
            if failure is None:
                return  # max_output_tokens and other errors that are not the API's
            # Claude Code closes repeated 529s with a server_error message: keep the finer class.
            if not (failure is ApiFailure.SERVER_ERROR and self._failure is ApiFailure.OVERLOADED):
                self._failure = failure
            return
        message = event.get("message")
        if not isinstance(message, dict):
            return
        model = message.get("model")
        if not isinstance(model, str) or not model or model == SYNTHETIC_MODEL:
            return
        self._failure = None  # the API answered: what failed before was retried away
        key = message.get("id")
        if isinstance(key, str):
            # Read only if no result line comes (rarely): most runs never need it.
            self._messages[key] = (model, message.get("usage"))

    def on_result(self, event: dict[str, Any]) -> None:
        """The final ``result`` line: the run's figures."""
        if event.get("is_error") is True and self._failure is None:
            # What the stream named before (an assistant error, a retry) is finer
            # than the status: a billing error is an HTTP 400, say.
            status = count(event.get("api_error_status"))
            result = text_of(event.get("result"))
            if status is not None:
                self._failure = failure_of_status(status)
            elif result is not None and result.startswith("API Error"):
                self._failure = failure_of_text(result)
        self._result = RunUsage(
            tokens=result_tokens(event.get("usage")),
            cost_usd=usd(event.get("total_cost_usd")),
            models=model_usage(event.get("modelUsage")),
            turns=count(event.get("num_turns")),
            duration=seconds(event.get("duration_ms")),
            api_time=seconds(event.get("duration_api_ms")),
            terminal_reason=text_of(event.get("terminal_reason")),
        )

    def _from_messages(self) -> RunUsage:
        by_model: dict[str, Tokens] = {}
        for model, usage in self._messages.values():
            tokens = result_tokens(usage)
            if tokens is not None:
                by_model[model] = by_model.get(model, Tokens()) + tokens
        if not by_model:
            return RunUsage()
        models = tuple(ModelUsage(model=name, tokens=by_model[name]) for name in sorted(by_model))
        total = sum((entry.tokens for entry in models), Tokens())
        return RunUsage(tokens=total, models=models, partial=True)

    def usage(self, *, succeeded: bool) -> RunUsage | None:
        """What was read, None if nothing; ``succeeded``: the run's verdict was success."""
        base = self._result if self._result is not None else self._from_messages()
        found = attrs.evolve(
            base,
            near_limit=self._near_limit,
            failure=None if succeeded else self._failure,
            retries=self._retries,
            last_retry=self._last_retry,
        )
        return None if found.empty else found
