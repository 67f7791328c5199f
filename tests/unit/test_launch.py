"""SpecBuilder's cached templates give every run exactly the spec built from scratch."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import timedelta
from pathlib import Path

import attrs
from hypothesis import given
from hypothesis import strategies as st

from herdsman.config import Config, load_config_text
from herdsman.config.model import Account
from herdsman.runtime.accounts import account_env
from herdsman.runtime.launch import (
    PARALLEL_PREAMBLE,
    RUN_FIELDS,
    SpecBuilder,
    _run_spec,
    log_file,
)
from herdsman.runtime.runner import OwnedEnv, ProcessSpec
from herdsman.runtime.runner import spec as spec_module
from herdsman.runtime.store import RunRecord, RunStatus

BASE = load_config_text(
    '[supervisor]\nstate_dir = "/srv/state"\n\n[providers.p]\nexec = ["/bin/true", "-x"]\n',
    Path("/srv/supervisor.toml"),
).config

# Few names, so that the ambient, provider and account environments overlap
# each other and herdsman's own variables.
NAMES = st.sampled_from(
    [
        "PATH",
        "A",
        "B",
        "HERDSMAN_RUN_ID",
        "HERDSMAN_CONVERSATION",
        "HERDSMAN_ATTEMPT",
        "HERDSMAN_STATE_DIR",
        "HERDSMAN_ACCOUNT",
        "HERDSMAN_PARALLEL",
        "HERDSMAN_REPOS",
    ]
)
ENVS = st.dictionaries(NAMES, st.text(max_size=3), max_size=5)
SECONDS = st.none() | st.integers(1, 1000).map(lambda s: timedelta(seconds=s))


@st.composite
def configs(draw: st.DrawFn) -> Config:
    """The base configuration with its provider's env, accounts and limits drawn."""
    names = draw(st.lists(st.sampled_from(["a", "b"]), unique=True, max_size=2))
    provider = attrs.evolve(
        BASE.providers["p"],
        env=draw(ENVS),
        accounts=tuple(Account(name=name, env=draw(ENVS)) for name in names),
        concurrency=draw(st.integers(1, 3)),
        timeout=draw(SECONDS),
        idle_timeout=draw(SECONDS),
    )
    supervisor = attrs.evolve(
        BASE.supervisor,
        max_concurrency=draw(st.none() | st.integers(1, 3)),
        parallel_preamble=draw(st.booleans()),
    )
    return attrs.evolve(BASE, providers={"p": provider}, supervisor=supervisor)


def run_record(number: int, **fields: object) -> RunRecord:
    """A running run of provider ``p``, with ``fields`` on top of a plain one."""
    plain: dict[str, object] = {
        "id": f"r{number}",
        "provider": "p",
        "prompt": "go",
        "conversation": None,
        "agent": None,
        "workspace": "default",
        "callback_url": None,
        "metadata": {},
        "seq": number,
        "status": RunStatus.RUNNING,
        "submitted_at": 0.0,
    }
    return RunRecord(**(plain | fields))  # type: ignore[arg-type]


@st.composite
def runs(draw: st.DrawFn, number: int) -> tuple[RunRecord, tuple[str, ...], str, Path | None]:
    """A run record (on an account or none, configured or not) and what its start adds."""
    record = run_record(
        number,
        prompt=draw(st.text(max_size=5)),
        conversation=draw(st.none() | st.text(max_size=3)),
        account=draw(st.sampled_from([None, "a", "b"])),
        cwd=draw(st.none() | st.just("/srv/elsewhere")),
        attempts=draw(st.integers(1, 3)),
    )
    resume = tuple(draw(st.lists(st.text(max_size=3), max_size=2)))
    note = draw(st.sampled_from(["", "checkouts:\n"]))
    repos = draw(st.none() | st.just(Path("/srv/state/worktrees/c")))
    return record, resume, note, repos


def from_scratch(
    record: RunRecord,
    config: Config,
    base: Mapping[str, str],
    *,
    resume: Sequence[str],
    note: str,
    repos: Path | None,
) -> ProcessSpec:
    """The straightforward construction: everything worked out anew for the run."""
    provider = config.providers[record.provider]
    slots = provider.concurrency
    cap = config.supervisor.max_concurrency
    parallel = min(slots, cap) > 1 if cap is not None else slots > 1
    prompt = note + record.prompt
    if parallel and config.supervisor.parallel_preamble:
        prompt = PARALLEL_PREAMBLE + prompt
    env = {**base, **provider.env, **account_env(provider, record.account)}
    # herdsman's own variables, in this order; None removes an ambient one.
    own = {
        "HERDSMAN_RUN_ID": record.id,
        "HERDSMAN_CONVERSATION": record.conversation or "",
        "HERDSMAN_ATTEMPT": str(record.attempts),
        "HERDSMAN_STATE_DIR": str(config.supervisor.state_dir),
        "HERDSMAN_ACCOUNT": record.account,
        "HERDSMAN_PARALLEL": "1" if parallel else None,
    }
    if repos is not None:  # an ambient HERDSMAN_REPOS is kept otherwise
        own["HERDSMAN_REPOS"] = str(repos)
    for name, value in own.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    return ProcessSpec(
        argv=(*provider.exec, *resume),
        env=env,
        cwd=record.cwd if record.cwd is not None else provider.workdir,
        prompt=prompt,
        timeout=provider.timeout.total_seconds() if provider.timeout else None,
        idle_timeout=provider.idle_timeout.total_seconds() if provider.idle_timeout else None,
        log_path=config.supervisor.state_dir / "logs" / f"{record.id}.log",
        protocol=provider.protocol,
        usage_limit_pattern=provider.usage_limit_pattern,
        make_cwd=record.cwd is None,
    )


@given(
    base=ENVS,
    configurations=st.lists(configs(), min_size=1, max_size=3),
    starts=st.lists(st.integers(0, 2), max_size=8),
    data=st.data(),
)
def test_every_run_gets_what_building_it_from_scratch_gives(
    base: dict[str, str],
    configurations: list[Config],
    starts: list[int],
    data: st.DataObject,
) -> None:
    # One builder for all the runs, under configurations that come and go
    # (a reload, and runs still started under the one before it).
    builder = SpecBuilder(base)
    built = []
    for number, which in enumerate(starts):
        config = configurations[which % len(configurations)]
        record, resume, note, repos = data.draw(runs(number))
        spec = builder.spec(
            record,
            config,
            resume=resume,
            program="/bin/true",
            checkouts_note=note,
            repos_dir=repos,
        )
        expected = from_scratch(record, config, base, resume=resume, note=note, repos=repos)
        built.append((spec, expected))
    # Compared only once all are built: a run's spec must not change when
    # later runs are built from the same cached template.
    for spec, expected in built:
        assert spec == expected
        assert list(spec.env.items()) == list(expected.env.items())  # the order too


def test_a_later_change_to_the_ambient_environment_does_not_reach_runs() -> None:
    ambient = {"A": "1"}
    builder = SpecBuilder(ambient)
    ambient["A"] = "2"
    assert builder.spec(run_record(0), BASE).env["A"] == "1"


def test_runs_without_resume_or_cwd_share_everything_but_their_own_fields() -> None:
    # Their specs are the template's, with RUN_FIELDS written over it: the
    # shared fields are the very objects checked once, not built again.
    builder = SpecBuilder({})
    first, second = (
        builder.spec(run_record(n), BASE, program="/bin/true", checkouts_note=note)
        for n, note in ((0, ""), (1, "checkouts:\n"))
    )
    assert first.argv is second.argv
    assert first.cwd is second.cwd
    assert (first.env["HERDSMAN_RUN_ID"], second.env["HERDSMAN_RUN_ID"]) == ("r0", "r1")
    assert (first.prompt, second.prompt) == ("go", "checkouts:\ngo")
    assert (first.log_file, second.log_file) == ("/srv/state/logs/r0.log", "/srv/state/logs/r1.log")
    assert first == ProcessSpec(
        ("/bin/true", "-x"),
        dict(first.env),
        BASE.providers["p"].workdir,
        "go",
        None,
        900.0,  # the default idle timeout
        "/srv/state/logs/r0.log",
        "plain",
        make_cwd=True,
    )
    assert builder.log_file(BASE, "r7") == log_file(BASE.supervisor.state_dir, "r7")


def test_a_spec_copied_for_a_run_converts_what_init_would() -> None:
    # _run_spec writes RUN_FIELDS straight into a copy of the shared spec's
    # __dict__: sound only while __init__ stores them so (env through
    # _frozen_env, which keeps an OwnedEnv as it is; the others as given)
    # and has nothing else to do.
    fields = attrs.fields_dict(ProcessSpec)
    converters: dict[str, object] = {name: fields[name].converter for name in RUN_FIELDS}
    assert converters["env"] is spec_module._frozen_env
    assert converters["log_file"] is spec_module._str_path
    assert fields["prompt"].converter is None
    for name in RUN_FIELDS:
        assert fields[name].validator is None, name
        assert fields[name].on_setattr is None, name
    for hook in ("__attrs_pre_init__", "__attrs_post_init__", "__attrs_init__"):
        assert not hasattr(ProcessSpec, hook), hook
    assert "__slots__" not in vars(ProcessSpec)
    env = OwnedEnv({"A": "1"})
    shared = SpecBuilder({}).spec(run_record(0), BASE, program="/bin/true")
    assert _run_spec(shared, env, "p", "/l") == attrs.evolve(
        shared, env=env, prompt="p", log_path="/l"
    )
