"""What the scheduler knows about a run, and the exclusion keys derived from it."""

from __future__ import annotations

import attrs

DEFAULT_WORKSPACE = "default"


@attrs.frozen(slots=True)
class RunRequest:
    """A run as the scheduler sees it: who executes it and which lanes it joins.

    ``conversation`` and ``agent`` are optional. A run without a conversation
    gets a lane of its own; ``agent`` only matters while agent exclusivity is
    on. Both are scoped by ``workspace``, so equal ids in two workspaces never
    block each other.
    """

    id: str
    provider: str
    conversation: str | None = None
    agent: str | None = None
    workspace: str = DEFAULT_WORKSPACE


def conversation_key(workspace: str, conversation: str) -> str:
    """The lane key every run of one conversation shares."""
    return f"conversation:{workspace}/{conversation}"


def agent_key(workspace: str, agent: str) -> str:
    """The lane key every run of one agent shares while agent exclusivity is on."""
    return f"agent:{workspace}/{agent}"


def exclusion_keys(run: RunRequest, *, agent_exclusive: bool) -> tuple[str, ...]:
    """The keys no two running runs may share, in a fixed order.

    A run without a conversation is on a lane of its own: since run ids are
    unique that lane can never be contended, so it gets no key at all (keeping
    a queue per lone run would cost memory for nothing).
    """
    keys: list[str] = []
    if run.conversation is not None:
        keys.append(conversation_key(run.workspace, run.conversation))
    if agent_exclusive and run.agent is not None:
        keys.append(agent_key(run.workspace, run.agent))
    return tuple(keys)
