"""What the scheduler knows about a run, and the exclusion keys derived from it."""

from __future__ import annotations

from pathlib import PurePosixPath

import attrs

DEFAULT_WORKSPACE = "default"


def _absolute_posix(_: object, attribute: attrs.Attribute[str | None], value: str | None) -> None:
    if value is not None and not PurePosixPath(value).is_absolute():
        raise ValueError(f"{attribute.name} must be an absolute path, got {value!r}")


# Frozen, but not slotted: each field goes straight into the instance's
# __dict__ instead of through object.__setattr__ (store/records.py, NewRun).
# One is built per run submitted.
@attrs.frozen(slots=False)
class RunRequest:
    """A run as the scheduler sees it: who executes it and which lanes it joins.

    ``conversation`` and ``agent`` are optional. A run without a conversation
    gets a lane of its own; ``agent`` only matters while agent exclusivity is
    on. Both are scoped by ``workspace``, so equal ids in two workspaces never
    block each other.

    ``cwd``, when given, is the absolute working directory the run will use,
    already resolved (symlinks followed) by the caller: two runs whose
    directories overlap — one contains the other — never execute together,
    across workspaces too, since they share a filesystem.
    """

    id: str
    provider: str
    conversation: str | None = None
    agent: str | None = None
    workspace: str = DEFAULT_WORKSPACE
    cwd: str | None = attrs.field(default=None, validator=_absolute_posix)


def conversation_key(workspace: str, conversation: str) -> str:
    """The lane key every run of one conversation shares."""
    return f"conversation:{workspace}/{conversation}"


def agent_key(workspace: str, agent: str) -> str:
    """The lane key every run of one agent shares while agent exclusivity is on."""
    return f"agent:{workspace}/{agent}"


def cwd_key(path: str) -> str:
    """The key of one directory in the working-directory tree."""
    return f"cwd:{path}"


def exclusion_keys(run: RunRequest, *, agent_exclusive: bool) -> tuple[str, ...]:
    """The keys a run holds exclusively, in a fixed order.

    A run without a conversation is on a lane of its own: since run ids are
    unique that lane can never be contended, so it gets no key at all (keeping
    a queue per lone run would cost memory for nothing).
    """
    keys = busy_keys(run, agent_exclusive=agent_exclusive)
    if run.cwd is not None:
        keys += (cwd_key(str(PurePosixPath(run.cwd))),)
    return keys


def busy_keys(run: RunRequest, *, agent_exclusive: bool) -> tuple[str, ...]:
    """The exclusion keys that make a follow-up a duplicate: conversation and agent.

    A shared working directory is not one: two runs in one folder are not
    the same request twice, so ``on_busy: "skip"`` ignores the cwd key.
    """
    if run.conversation is None:
        if agent_exclusive and run.agent is not None:
            return (agent_key(run.workspace, run.agent),)
        return ()
    if agent_exclusive and run.agent is not None:
        return (
            conversation_key(run.workspace, run.conversation),
            agent_key(run.workspace, run.agent),
        )
    return (conversation_key(run.workspace, run.conversation),)


def intention_keys(run: RunRequest) -> tuple[str, ...]:
    """The keys a run holds in *intention* mode: every proper ancestor of its cwd.

    Multi-granularity locking: a run holds its own directory exclusively and
    each ancestor in intention mode. Exclusive conflicts with both modes,
    intention only with exclusive, so two runs conflict exactly when one's
    directory contains the other's, and disjoint trees never block each other.
    """
    if run.cwd is None:
        return ()
    return tuple(cwd_key(str(parent)) for parent in reversed(PurePosixPath(run.cwd).parents))


def conflict(a: RunRequest, b: RunRequest, *, agent_exclusive: bool) -> bool:
    """Whether ``a`` and ``b`` may never run at the same time."""
    a_keys = set(exclusion_keys(a, agent_exclusive=agent_exclusive))
    b_keys = set(exclusion_keys(b, agent_exclusive=agent_exclusive))
    if a_keys & b_keys:
        return True
    return bool(a_keys & set(intention_keys(b))) or bool(b_keys & set(intention_keys(a)))
