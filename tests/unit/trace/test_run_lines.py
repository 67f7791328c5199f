"""A run's submit, start and finish lines from their values are record's lines, byte for byte."""

from __future__ import annotations

import datetime as dt
import io
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from herdsman.core.retry import Failure
from herdsman.runtime.requests import trace_run, trace_run_text
from herdsman.runtime.runner.run_usage import ModelUsage, Tokens
from herdsman.runtime.store import NewRun, Spend
from herdsman.runtime.store.records import spend_json
from herdsman.trace import TraceWriter, _dumps


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _writer(
    clock: Clock,
    *,
    sink: io.StringIO | None = None,
    directory: Path = Path("/unused"),
    max_bytes: int = 1 << 62,
) -> TraceWriter:
    writer = TraceWriter(
        directory,
        max_bytes=max_bytes,
        config={},
        clock=clock,
        wall=lambda: dt.datetime(2026, 11, 30, tzinfo=dt.UTC),
        sink=sink,
    )
    writer.open()
    return writer


texts = st.text(max_size=6) | st.sampled_from(["run-0001", "team", 'ü/\n"\\', "\x00\u2028"])
maybe_texts = st.none() | texts
runs = st.builds(
    NewRun,
    id=texts,
    provider=texts,
    prompt=texts,
    conversation=maybe_texts,
    agent=maybe_texts,
    workspace=texts,
    cwd=maybe_texts,
)


@given(runs, st.booleans())
def test_a_run_objects_text_is_what_the_encoder_writes_for_its_dict(
    run: NewRun, with_prompt: bool
) -> None:
    assert trace_run_text(run, with_prompt=with_prompt) == _dumps(
        trace_run(run, with_prompt=with_prompt)
    )


counts = st.integers(min_value=0, max_value=2**63 - 1)
tokens = st.builds(Tokens, counts, counts, counts, counts, counts)
costs = st.none() | st.floats(min_value=0, max_value=1e9, allow_nan=False, allow_infinity=False)
spends = st.builds(
    Spend,
    tokens=st.none() | tokens,
    cost_usd=costs,
    models=st.lists(st.builds(ModelUsage, texts, tokens, costs), max_size=2).map(tuple),
    turns=st.none() | st.integers(min_value=0, max_value=10**6),
    api_time=costs,
).map(spend_json)

# One run's three lines: (kind, time step, values).
events = st.one_of(
    st.tuples(st.just("submit"), runs, st.booleans()),
    st.tuples(st.just("start"), texts, maybe_texts),
    st.tuples(
        st.just("finish"),
        texts,
        st.sampled_from(["succeeded", "failed", "usage_limited"]),
        st.none() | st.integers(min_value=-(2**70), max_value=2**70),
        st.booleans(),
        st.none() | spends,
        # A failure's retry class, whether the agent worked, whether it reported a session.
        st.none() | st.sampled_from(list(Failure)),
        st.booleans(),
        st.booleans(),
        # How long before the line its end was read (None: not said).
        st.none() | st.sampled_from([0.0, 4e-7, 0.000001, 0.25, 3.0, 2e9]),
    ),
)
steps = st.sampled_from([0.0, 0.0, 0.00005, 1.5, 2.0000005, 1e9])


def _by_values(writer: TraceWriter, event: tuple[Any, ...]) -> None:
    match event:
        case ("submit", run, with_prompt):
            writer.submit(run.id, trace_run_text(run, with_prompt=with_prompt))
        case ("start", run_id, account):
            writer.start(run_id, account)
        case ("finish", run_id, outcome, exit_code, requeued, spend, failure, worked, session, ago):
            writer.finish(
                run_id,
                outcome,
                exit_code,
                requeued=requeued,
                spend=spend,
                failure=failure,
                worked=worked,
                session=session,
                ended=None if ago is None else writer.now() - ago,
            )


def _by_record(writer: TraceWriter, event: tuple[Any, ...]) -> None:
    match event:
        case ("submit", run, with_prompt):
            writer.record("submit", {"run": trace_run(run, with_prompt=with_prompt)})
        case ("start", run_id, account):
            writer.record("start", {"run_id": run_id, "account": account})
        case ("finish", run_id, outcome, exit_code, requeued, spend, failure, worked, session, ago):
            fields = {"run_id": run_id, "outcome": outcome, "exit_code": exit_code}
            if failure is not None:
                fields["failure"] = failure.value
                if worked:
                    fields["worked"] = True
            if session:
                fields["session"] = True
            if requeued:
                fields["requeued"] = True
            if spend is not None:
                fields["spend"] = spend
            if ago is not None:
                # The end read before the line, after the file began: said in
                # the line's time. (The writer's clock reads the same here.)
                line_t = round(writer.now() - writer._origin, 6)
                read = round(writer.now() - ago - writer._origin, 6)
                if 0 < read < line_t:
                    fields["ended"] = read
            writer.record("finish", fields)


@settings(max_examples=200)
@given(st.lists(st.tuples(steps, events), max_size=12))
def test_a_runs_lines_are_records_lines(script: list[tuple[float, tuple[Any, ...]]]) -> None:
    # The first line at the writer's opening instant (0.0: record's own
    # path), lines at the instant of the one before, a hair apart, far on.
    got, want = io.StringIO(), io.StringIO()
    clock = Clock()
    by_values, by_record = _writer(clock, sink=got), _writer(clock, sink=want)
    for step, event in script:
        clock.now += step
        _by_values(by_values, event)
        _by_record(by_record, event)
    assert got.getvalue() == want.getvalue()


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(steps, events), min_size=1, max_size=12), st.integers(0, 11))
def test_a_rotated_file_carries_the_runs_those_lines_told_of(
    script: list[tuple[float, tuple[Any, ...]]], rotate_after: int
) -> None:
    # Production's writer follows the runs from either path alike: the
    # next file's header restates the same runs, queued and running.
    outputs = []
    for write in (_by_values, _by_record):
        clock = Clock()
        with tempfile.TemporaryDirectory() as name:
            writer = _writer(clock, directory=Path(name))
            for n, (step, event) in enumerate(script):
                clock.now += step
                write(writer, event)
                if n == rotate_after:
                    writer.rotate()
            writer.rotate()
            writer.close()
            files = sorted(
                Path(name).glob("trace-*.jsonl"), key=lambda p: int(p.stem.rsplit("-", 1)[1])
            )
            outputs.append([path.read_text(encoding="utf-8") for path in files])
    # The files byte for byte: their headers' carries too.
    assert outputs[0] == outputs[1]
