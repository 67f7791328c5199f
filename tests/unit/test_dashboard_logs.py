"""A run's log read in pieces for the dashboard: whole lines, rendered, never through a link."""

from __future__ import annotations

import json
from pathlib import Path

from herdsman.runtime.dashboard.logs import CHUNK, read_piece
from herdsman.runtime.runner.protocols import LogText


def write_log(state_dir: Path, data: bytes) -> Path:
    logs = state_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    path = logs / "r1.log"
    path.write_bytes(data)
    return path


def test_a_running_runs_partial_line_waits_and_an_ended_runs_does_not(tmp_path: Path) -> None:
    write_log(tmp_path, b"one\ntwo\npart")
    going = read_piece(tmp_path, "r1", 0, ended=False)
    assert going == {"text": "one\ntwo\n", "offset": 8, "missing": False, "more": False}
    ended = read_piece(tmp_path, "r1", going["offset"], ended=True)
    assert ended == {"text": "part\n", "offset": 12, "missing": False, "more": False}


def test_pieces_of_a_long_log_add_up_to_the_whole_rendering(tmp_path: Path) -> None:
    events: list[dict[str, object]] = [
        {"type": "system", "subtype": "init", "session_id": "s1", "model": "m"}
    ]
    events += [
        {"type": "assistant", "message": {"content": [{"type": "text", "text": f"step {i}"}]}}
        for i in range(8000)
    ]
    data = "".join(json.dumps(event) + "\n" for event in events).encode()
    assert len(data) > 2 * CHUNK
    write_log(tmp_path, data)
    text, offset, pieces = "", 0, 0
    while True:
        piece = read_piece(tmp_path, "r1", offset, ended=True)
        text += piece["text"]
        offset = piece["offset"]
        pieces += 1
        if not piece["more"]:
            break
    whole = LogText()
    assert pieces > 2
    assert text == whole.feed(data) + whole.finish()
    assert "step 7999" in text
    assert '"type"' not in text  # rendered, not the raw stream


def test_no_log_yet_and_a_link_in_its_place(tmp_path: Path) -> None:
    assert read_piece(tmp_path, "r1", 0, ended=False)["missing"] is True
    secret = tmp_path / "secret"
    secret.write_text("not a log\n")
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "r1.log").symlink_to(secret)
    piece = read_piece(tmp_path, "r1", 0, ended=True)
    assert piece["text"] == ""
    assert "symbolic link" in piece["error"]
