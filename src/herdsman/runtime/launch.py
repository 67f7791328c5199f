"""Turning a run record and the config into the process to execute."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from types import MappingProxyType

import attrs

from herdsman.config import Config, Provider
from herdsman.executables import resolve_executable
from herdsman.runtime.accounts import account_env
from herdsman.runtime.runner import OwnedEnv, ProcessSpec
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


def template_environment(
    provider: Provider,
    account: str | None,
    *,
    parallel: bool,
    base: Mapping[str, str],
    state_dir: Path,
) -> dict[str, str]:
    """What every run of ``provider`` on ``account`` gets: ambient, provider, account, herdsman's.

    The run's own variables (``HERDSMAN_RUN_ID``, ``HERDSMAN_CONVERSATION``,
    ``HERDSMAN_ATTEMPT``) hold empty placeholders, so that setting them per run keeps the order of
    the variables exactly as building the environment from scratch gives it.
    """
    env = dict(base)
    env.update(provider.env)
    env.update(account_env(provider, account))
    env["HERDSMAN_RUN_ID"] = ""
    env["HERDSMAN_CONVERSATION"] = ""
    env["HERDSMAN_ATTEMPT"] = ""
    # With the run id, this finds an agent that outlived a killed supervisor.
    env["HERDSMAN_STATE_DIR"] = str(state_dir)
    if account is not None:
        env["HERDSMAN_ACCOUNT"] = account
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


@attrs.frozen
class _Template:
    """What the runs of one provider on one account share under one configuration.

    ``spec`` is the spec of a run without resume arguments or a working
    directory of its own, with ``program``, whose run-specific fields
    (:data:`RUN_FIELDS`) :func:`_run_spec` writes over for each such run.
    """

    provider: Provider
    env: dict[str, str]
    preamble: str
    timeout: float | None
    idle_timeout: float | None
    logs: str
    program: str | None
    spec: ProcessSpec


#: The fields of a :class:`ProcessSpec` that differ between runs sharing a
#: template's spec, as ``__init__`` stores them: ``env`` through its
#: converter (``_frozen_env``, which takes an :class:`OwnedEnv` as it is),
#: the other two as given (a test keeps ``ProcessSpec`` so).
RUN_FIELDS = ("env", "prompt", "log_file")


def _run_spec(shared: ProcessSpec, env: OwnedEnv, prompt: str, log_path: str) -> ProcessSpec:
    """``shared`` with a run's own environment, prompt and log, without a call of ``__init__``.

    Every other field is the same for every such run, checked and converted
    once when the template's spec was built: its ``__init__`` (twelve fields,
    nine converters and validators, one a ``Path`` check that is a Python
    call under the simulator's pyfakefs) cost more than the rest of a
    spec. As ``RunRecord``'s changes (store/records.py): the shared spec's
    ``__dict__`` copied, the run's values written over it, set as attrs
    sets attributes of a frozen instance.
    """
    fields = shared.__dict__.copy()
    fields["env"] = MappingProxyType(env)
    fields["prompt"] = prompt
    fields["log_file"] = log_path
    spec = object.__new__(ProcessSpec)
    object.__setattr__(spec, "__dict__", fields)
    return spec


class SpecBuilder:
    """Builds each run's :class:`ProcessSpec`, doing per run only what is the run's own.

    The environment every run of a provider and account shares (ambient,
    provider, account, herdsman's), the preamble and the limits are worked
    out once per configuration and kept while runs are started under that
    configuration object; a reload brings a new one, so its changes (a
    provider's ``env``, say) reach the next run started under it. So is the
    whole spec of a run without resume arguments or a working directory of
    its own (most runs): such a run's spec is that one with the run's
    environment, prompt and log path written over it.
    """

    def __init__(self, base_env: Mapping[str, str]) -> None:
        # A snapshot: reading os.environ decodes every variable, every time.
        self._base = dict(base_env)
        self._config: Config | None = None
        self._templates: dict[tuple[str, str | None], _Template] = {}
        self._logs_config: Config | None = None
        self._logs = ""

    def _template(
        self, config: Config, provider_name: str, account: str | None, program: str | None
    ) -> _Template:
        if config is not self._config:
            # One configuration at a time: runs decided under the previous
            # one are few and only just after a reload.
            self._config, self._templates = config, {}
        key = (provider_name, account)
        template = self._templates.get(key)
        if template is None or template.program != program:
            # (A program resolved differently since, rarely: built again.)
            provider = config.providers[provider_name]
            parallel = may_run_in_parallel(config)
            env = template_environment(
                provider,
                account,
                parallel=parallel,
                base=self._base,
                state_dir=config.supervisor.state_dir,
            )
            timeout = provider.timeout.total_seconds() if provider.timeout else None
            idle_timeout = provider.idle_timeout.total_seconds() if provider.idle_timeout else None
            logs = f"{config.supervisor.state_dir}/logs/"
            template = _Template(
                provider=provider,
                env=env,
                preamble=(
                    PARALLEL_PREAMBLE if parallel and config.supervisor.parallel_preamble else ""
                ),
                timeout=timeout,
                idle_timeout=idle_timeout,
                logs=logs,
                program=program,
                # Through __init__, so every field is checked and converted as
                # for any spec; runs write only their own fields over it.
                spec=ProcessSpec(
                    build_argv(provider, (), program),
                    env,
                    provider.workdir,
                    "",
                    timeout,
                    idle_timeout,
                    logs,
                    provider.protocol,
                    usage_limit_pattern=provider.usage_limit_pattern,
                    make_cwd=True,
                ),
            )
            self._templates[key] = template
        return template

    def log_file(self, config: Config, run_id: str) -> str:
        """:func:`log_file` under ``config``, its folder's text kept per configuration."""
        if config is not self._logs_config:
            self._logs_config, self._logs = config, f"{config.supervisor.state_dir}/logs/"
        return self._logs + run_id + ".log"

    def spec(
        self,
        record: RunRecord,
        config: Config,
        *,
        resume: Sequence[str] = (),
        program: str | None = None,
        checkouts_note: str = "",
        repos_dir: Path | None = None,
    ) -> ProcessSpec:
        """Everything the runner needs to execute ``record``, on the account it holds.

        ``checkouts_note`` (what the worktree manager says about the run's
        checkouts) goes before the prompt; ``repos_dir``, the folder holding
        them, is exported as ``HERDSMAN_REPOS``.
        """
        template = self._template(config, record.provider, record.account, program)
        provider = template.provider
        env = OwnedEnv(template.env)  # the one copy this run's environment costs
        env["HERDSMAN_RUN_ID"] = record.id
        env["HERDSMAN_CONVERSATION"] = record.conversation or ""
        # Its starts so far, this one included: 2 and up is a retry or a re-queue.
        env["HERDSMAN_ATTEMPT"] = str(record.attempts)
        if repos_dir is not None:
            env["HERDSMAN_REPOS"] = str(repos_dir)
        prompt = template.preamble + checkouts_note + record.prompt
        log_path = template.logs + record.id + ".log"
        if not resume and record.cwd is None and program is not None:
            return _run_spec(template.spec, env, prompt, log_path)
        return ProcessSpec(
            argv=build_argv(provider, resume, program),
            env=env,
            cwd=record.cwd if record.cwd is not None else provider.workdir,
            prompt=prompt,
            timeout=template.timeout,
            idle_timeout=template.idle_timeout,
            log_path=log_path,
            protocol=provider.protocol,
            usage_limit_pattern=provider.usage_limit_pattern,
            # The provider's own folder is herdsman's to make (when the process is
            # spawned, so the simulator's fake runner never touches a disk); a
            # folder a client names must exist.
            make_cwd=record.cwd is None,
        )
