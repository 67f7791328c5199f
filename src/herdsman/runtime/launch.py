"""Turning a run record and the config into the process to execute."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from herdsman.config import Config, Provider
from herdsman.executables import resolve_executable
from herdsman.runtime.accounts import account_env
from herdsman.runtime.runner import ProcessSpec
from herdsman.runtime.store import RunRecord

PARALLEL_PREAMBLE = """\
[herdsman] Other agent runs may be executing on this machine at the same time
as this one. Name any scratch or temporary files uniquely (for example with
the run id in $HERDSMAN_RUN_ID), and do not assume that a branch, worktree or
file you did not create in this run is yours to change or delete.

"""


def may_run_in_parallel(config: Config) -> bool:
    """Whether more than one run can ever execute at once under ``config``."""
    slots = sum(p.concurrency for p in config.providers.values())
    cap = config.supervisor.max_concurrency
    return min(slots, cap) > 1 if cap is not None else slots > 1


def run_environment(
    record: RunRecord,
    provider: Provider,
    *,
    account_env: Mapping[str, str],
    parallel: bool,
    base: Mapping[str, str],
    state_dir: Path,
) -> dict[str, str]:
    """The child's environment: ambient, then provider, then account, then herdsman's."""
    env = dict(base)
    env.update(provider.env)
    env.update(account_env)
    env["HERDSMAN_RUN_ID"] = record.id
    env["HERDSMAN_CONVERSATION"] = record.conversation or ""
    # With the run id, this finds an agent that outlived a killed supervisor.
    env["HERDSMAN_STATE_DIR"] = str(state_dir)
    if record.account is not None:
        env["HERDSMAN_ACCOUNT"] = record.account
    else:
        env.pop("HERDSMAN_ACCOUNT", None)
    if parallel:
        env["HERDSMAN_PARALLEL"] = "1"
    else:
        env.pop("HERDSMAN_PARALLEL", None)
    return env


def log_file(state_dir: Path, run_id: str) -> str:
    """Where the output log of run ``run_id`` is written."""
    # A plain string: this is built for every run, and joining pathlib (or,
    # under the simulator's pyfakefs, os.path) paths costs more than the rest
    # of building a spec. state_dir is absolute and herdsman is POSIX-only.
    return f"{state_dir}/logs/{run_id}.log"


def build_argv(
    provider: Provider, resume: Sequence[str] = (), program: str | None = None
) -> tuple[str, ...]:
    """The provider's argv with its program resolved and resume arguments appended.

    ``program`` is an already resolved path for ``exec[0]`` (callers cache it).
    """
    if program is None:
        program = resolve_executable(provider.exec[0]) or provider.exec[0]
    return (program, *provider.exec[1:], *resume)


def build_spec(
    record: RunRecord,
    config: Config,
    *,
    resume: Sequence[str] = (),
    base_env: Mapping[str, str] | None = None,
    program: str | None = None,
    checkouts_note: str = "",
    repos_dir: Path | None = None,
) -> ProcessSpec:
    """Everything the runner needs to execute ``record``, on the account it holds.

    ``checkouts_note`` (what the worktree manager says about the run's
    checkouts) goes before the prompt; ``repos_dir``, the folder holding
    them, is exported as ``HERDSMAN_REPOS``.
    """
    provider = config.providers[record.provider]
    state_dir = config.supervisor.state_dir
    parallel = may_run_in_parallel(config)
    prompt = checkouts_note + record.prompt
    if parallel and config.supervisor.parallel_preamble:
        prompt = PARALLEL_PREAMBLE + prompt
    env = run_environment(
        record,
        provider,
        account_env=account_env(provider, record.account),
        parallel=parallel,
        base=os.environ if base_env is None else base_env,
        state_dir=state_dir,
    )
    if repos_dir is not None:
        env["HERDSMAN_REPOS"] = str(repos_dir)
    return ProcessSpec(
        argv=build_argv(provider, resume, program),
        env=env,
        cwd=record.cwd if record.cwd is not None else provider.workdir,
        prompt=prompt,
        timeout=provider.timeout.total_seconds() if provider.timeout else None,
        idle_timeout=provider.idle_timeout.total_seconds() if provider.idle_timeout else None,
        log_path=log_file(state_dir, record.id),
        protocol=provider.protocol,
        usage_limit_pattern=provider.usage_limit_pattern,
        # The provider's own folder is herdsman's to make (when the process is
        # spawned, so the simulator's fake runner never touches a disk); a
        # folder a client names must exist.
        make_cwd=record.cwd is None,
    )
