"""The runner: executing one agent process under limits (see docs/runner.md)."""

from herdsman.runtime.runner.api_failure import ApiFailure
from herdsman.runtime.runner.cancel import RunCancel
from herdsman.runtime.runner.excerpt import EXCERPT_LIMIT, FAILURE_MARKERS, ExcerptBuilder
from herdsman.runtime.runner.process import execute
from herdsman.runtime.runner.protocols import (
    ClaudeAdapter,
    CodexAdapter,
    PlainAdapter,
    ProtocolAdapter,
    Verdict,
    make_adapter,
)
from herdsman.runtime.runner.run_usage import (
    ApiRetry,
    ModelUsage,
    RateLimitWarning,
    RunUsage,
    Tokens,
)
from herdsman.runtime.runner.spec import (
    PROTOCOLS,
    Outcome,
    OwnedEnv,
    ProcessOutcome,
    ProcessSpec,
    UsageLimit,
    not_started,
)

__all__ = [
    "EXCERPT_LIMIT",
    "FAILURE_MARKERS",
    "PROTOCOLS",
    "ApiFailure",
    "ApiRetry",
    "ClaudeAdapter",
    "CodexAdapter",
    "ExcerptBuilder",
    "ModelUsage",
    "Outcome",
    "OwnedEnv",
    "PlainAdapter",
    "ProcessOutcome",
    "ProcessSpec",
    "ProtocolAdapter",
    "RateLimitWarning",
    "RunCancel",
    "RunUsage",
    "Tokens",
    "UsageLimit",
    "Verdict",
    "execute",
    "make_adapter",
    "not_started",
]
