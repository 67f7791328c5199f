"""execute() on real processes: adapters, stdin, environment, log and excerpt."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import trio
from runner_helpers import demo, make_spec, run_into, script

from herdsman.runtime.runner import ProcessOutcome, execute
from herdsman.runtime.runner.excerpt import EXCERPT_LIMIT
from herdsman.runtime.runner.spec import Outcome


async def test_plain_demo_agent_succeeds_with_its_reply(tmp_path: Path) -> None:
    spec = make_spec(tmp_path, prompt="and more\nsay hello")
    outcome = await execute(spec)
    assert outcome.status is Outcome.SUCCEEDED
    assert outcome.exit_code == 0
    assert outcome.reason is None
    assert outcome.limit is None
    assert outcome.result == "demo reply: say hello\n"
    assert outcome.session_id is None
    assert spec.log_path.read_bytes() == b"demo reply: say hello\n"
    assert outcome.excerpt == "demo reply: say hello\n"


async def test_plain_demo_agent_failure_says_exit_code(tmp_path: Path) -> None:
    outcome = await execute(make_spec(tmp_path, argv=demo("--delay", "0", "--fail")))
    assert outcome.status is Outcome.FAILED
    assert outcome.exit_code == 1
    assert outcome.reason == "exited with code 1: Error: demo agent: failing as asked (--fail)"
    assert "Error: demo agent: failing as asked (--fail)" in outcome.excerpt


async def test_plain_process_killed_by_a_signal_fails_naming_it(tmp_path: Path) -> None:
    code = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"
    outcome = await execute(make_spec(tmp_path, argv=script(code)))
    assert outcome.status is Outcome.FAILED
    assert outcome.exit_code == -9
    assert outcome.reason == "killed by signal SIGKILL"


async def test_plain_usage_limit_pattern_matches_stderr(tmp_path: Path) -> None:
    code = "import sys; sys.stderr.write('quota exhausted, back at 1767225600\\n'); sys.exit(3)"
    spec = make_spec(
        tmp_path,
        argv=script(code),
        usage_limit_pattern=r"quota exhausted, back at (?P<resets_at>\d+)",
    )
    outcome = await execute(spec)
    assert outcome.status is Outcome.FAILED
    assert outcome.usage_limit is not None
    assert outcome.usage_limit.resets_at == 1767225600.0
    assert outcome.usage_limit.message == "quota exhausted, back at 1767225600"


async def test_claude_demo_agent_succeeds_with_result_and_session(tmp_path: Path) -> None:
    spec = make_spec(tmp_path, argv=demo("--delay", "0", "--protocol", "claude"), protocol="claude")
    outcome = await execute(spec)
    assert outcome.status is Outcome.SUCCEEDED
    assert outcome.result == "demo reply: say hello"
    assert outcome.session_id is not None
    assert outcome.session_id.startswith("demo-")
    init, result = (json.loads(line) for line in spec.log_path.read_text().splitlines())
    assert init["session_id"] == result["session_id"] == outcome.session_id


async def test_claude_demo_agent_failure_uses_the_result_line(tmp_path: Path) -> None:
    argv = demo("--delay", "0", "--protocol", "claude", "--fail")
    outcome = await execute(make_spec(tmp_path, argv=argv, protocol="claude"))
    assert outcome.status is Outcome.FAILED
    assert outcome.exit_code == 1
    assert outcome.reason == (
        "claude reported an error (error_during_execution): demo agent: failing as asked (--fail)"
    )
    assert outcome.session_id is not None


async def test_claude_exit_zero_without_result_line_is_a_failure(tmp_path: Path) -> None:
    # Exit code 0 proves nothing: without the result line there is no reply.
    code = (
        "print('Welcome banner, not JSON');"
        'print(\'{"type":"system","subtype":"init","session_id":"s-1"}\')'
    )
    outcome = await execute(make_spec(tmp_path, argv=script(code), protocol="claude"))
    assert outcome.status is Outcome.FAILED
    assert outcome.exit_code == 0
    assert outcome.reason == (
        "claude printed no result line (exited with code 0); 1 stdout lines were not JSON"
    )
    assert outcome.session_id == "s-1"
    assert "Welcome banner, not JSON" in outcome.excerpt


CODEX_SUCCESS = [
    '{"type":"thread.started","thread_id":"0199a213-81c0-7800-8aa1-bbab2a035a53"}',
    '{"type":"turn.started"}',
    '{"type":"item.completed","item":{"id":"item_0","type":"reasoning","text":"thinking"}}',
    '{"type":"item.completed","item":{"id":"item_1","type":"agent_message","text":"Done."}}',
    '{"type":"turn.completed","usage":{"input_tokens":10,"cached_input_tokens":0,'
    '"output_tokens":5}}',
]


def _print_lines(lines: list[str], exit_code: int = 0) -> tuple[str, ...]:
    text = "\n".join(lines)
    return script(f"import sys; print({text!r}); sys.exit({exit_code})")


async def test_codex_stream_success_gives_reply_and_thread_id(tmp_path: Path) -> None:
    outcome = await execute(make_spec(tmp_path, argv=_print_lines(CODEX_SUCCESS), protocol="codex"))
    assert outcome.status is Outcome.SUCCEEDED
    assert outcome.result == "Done."
    assert outcome.session_id == "0199a213-81c0-7800-8aa1-bbab2a035a53"


async def test_codex_usage_limit_failure(tmp_path: Path) -> None:
    lines = [
        CODEX_SUCCESS[0],
        '{"type":"turn.started"}',
        '{"type":"error","message":"You\'ve hit your usage limit. Upgrade to Pro '
        '(https://openai.com/chatgpt/pricing) or try again in 2 hours 5 minutes."}',
        '{"type":"turn.failed","error":{"message":"You\'ve hit your usage limit."}}',
    ]
    outcome = await execute(
        make_spec(tmp_path, argv=_print_lines(lines, exit_code=1), protocol="codex")
    )
    assert outcome.status is Outcome.FAILED
    assert outcome.reason == "codex turn failed: You've hit your usage limit."
    assert outcome.usage_limit is not None
    assert outcome.usage_limit.resets_at is not None
    assert outcome.usage_limit.message.startswith("You've hit your usage limit.")


async def test_prompt_arrives_on_stdin_byte_for_byte_and_never_in_argv(tmp_path: Path) -> None:
    token = "herdsman-secret-" + os.urandom(6).hex()
    prompt = f"{token}\nünïcödé ✓\r\n\ttabs and a trailing line without newline"
    code = (
        "import sys, time; data = sys.stdin.buffer.read(); "
        "sys.stdout.buffer.write(data); sys.stdout.flush(); time.sleep(0.5)"
    )
    spec = make_spec(tmp_path, argv=script(code), prompt=prompt)
    outcomes: list[ProcessOutcome] = []
    async with trio.open_nursery() as nursery:
        pid = await nursery.start(run_into, outcomes, spec)
        # While the child runs, no process's command line or the child's
        # environment mentions the prompt.
        await trio.sleep(0.1)
        assert Path(f"/proc/{pid}/cmdline").exists()
        assert token.encode() not in Path(f"/proc/{pid}/environ").read_bytes()
        for proc in Path("/proc").iterdir():
            if proc.name.isdigit():
                try:
                    cmdline = (proc / "cmdline").read_bytes()
                except OSError:
                    continue
                assert token.encode() not in cmdline, proc
    [outcome] = outcomes
    assert outcome.status is Outcome.SUCCEEDED
    assert spec.log_path.read_bytes() == prompt.encode("utf-8")
    assert outcome.result == prompt


async def test_environment_is_exactly_the_spec_env(tmp_path: Path) -> None:
    env = {"ONLY_THIS": "1", "EMPTY": "", "UNICODE": "ü"}
    # /proc/self/environ is what execve received, before Python touches it.
    code = "import sys; sys.stdout.buffer.write(open('/proc/self/environ', 'rb').read())"
    spec = make_spec(tmp_path, argv=script(code), env=env)
    outcome = await execute(spec)
    assert outcome.status is Outcome.SUCCEEDED
    received = dict(item.split(b"=", 1) for item in spec.log_path.read_bytes().split(b"\0") if item)
    assert received == {k.encode(): v.encode() for k, v in env.items()}


async def test_environment_of_the_parent_is_not_inherited(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HERDSMAN_PARENT_ONLY", "leak")
    code = "import os; print(os.environ.get('HERDSMAN_PARENT_ONLY', 'absent'))"
    outcome = await execute(make_spec(tmp_path, argv=script(code)))
    assert outcome.result == "absent\n"


async def test_cwd_is_the_spec_cwd(tmp_path: Path) -> None:
    workdir = tmp_path / "work dir"
    workdir.mkdir()
    outcome = await execute(
        make_spec(tmp_path, argv=script("import os; print(os.getcwd())"), cwd=workdir)
    )
    assert outcome.result == f"{workdir}\n"


async def test_log_file_equals_the_output_including_invalid_utf8(tmp_path: Path) -> None:
    payload = b"line one\n\xff\xfe not utf-8\nno newline at the end"
    code = f"import sys; sys.stdout.buffer.write({payload!r})"
    spec = make_spec(tmp_path, argv=script(code), log_path=tmp_path / "a" / "b" / "run.log")
    outcome = await execute(spec)
    assert spec.log_path.read_bytes() == payload
    assert outcome.excerpt == payload.decode("utf-8", errors="replace")


async def test_long_output_gives_a_bounded_excerpt_with_failure_lines(tmp_path: Path) -> None:
    code = (
        "for i in range(5000):\n"
        "    print(f'line {i}')\n"
        "    if i == 2500: print('Traceback (most recent call last): boom')\n"
    )
    spec = make_spec(tmp_path, argv=script(code))
    outcome = await execute(spec)
    assert len(outcome.excerpt.encode()) <= EXCERPT_LIMIT
    assert outcome.excerpt.startswith("line 0\nline 1\n")
    assert outcome.excerpt.endswith("line 4999")
    assert "[line 2502] Traceback (most recent call last): boom" in outcome.excerpt
    assert "lines elided; 1 matching lines kept]" in outcome.excerpt


async def test_spawn_failure_raises_oserror(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        await execute(make_spec(tmp_path, argv=("/nonexistent/agent-cli",)))


async def test_a_bare_program_name_is_found_on_the_spec_path(tmp_path: Path) -> None:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "python-agent").symlink_to(os.path.realpath(demo()[0]))
    spec = make_spec(
        tmp_path,
        argv=("python-agent", "-c", "print('found')"),
        env={"PATH": str(bindir)},
    )
    outcome = await execute(spec)
    assert outcome.result == "found\n"
