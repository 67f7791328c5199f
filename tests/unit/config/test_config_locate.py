"""Where the file is found: -c, $HERDSMAN_CONFIG, ./supervisor.toml, XDG config."""

from __future__ import annotations

from pathlib import Path

import pytest

from herdsman.config import ConfigError, find_config_file, load_config

MINIMAL = '[providers.claude]\nexec = ["claude", "-p"]\n'


@pytest.fixture
def places(tmp_path: Path) -> dict[str, Path]:
    paths = {
        "explicit": tmp_path / "explicit.toml",
        "env": tmp_path / "env.toml",
        "cwd": tmp_path / "cwd" / "supervisor.toml",
        "xdg": tmp_path / "xdg" / "herdsman" / "supervisor.toml",
    }
    for path in paths.values():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(MINIMAL)
    return paths


def test_search_order(places: dict[str, Path]) -> None:
    environ = {
        "HERDSMAN_CONFIG": str(places["env"]),
        "XDG_CONFIG_HOME": str(places["xdg"].parents[1]),
    }
    cwd = places["cwd"].parent
    assert find_config_file(places["explicit"], environ, cwd) == places["explicit"]
    assert find_config_file(None, environ, cwd) == places["env"]
    del environ["HERDSMAN_CONFIG"]
    assert find_config_file(None, environ, cwd) == places["cwd"]
    places["cwd"].unlink()
    assert find_config_file(None, environ, cwd) == places["xdg"]


def test_xdg_default_is_dot_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    path = tmp_path / ".config" / "herdsman" / "supervisor.toml"
    path.parent.mkdir(parents=True)
    path.write_text(MINIMAL)
    assert find_config_file(None, {}, tmp_path / "elsewhere") == path


def test_an_explicit_file_that_is_missing_is_not_silently_replaced(places: dict[str, Path]) -> None:
    missing = places["explicit"].with_name("missing.toml")
    with pytest.raises(ConfigError, match=r"missing\.toml: cannot read file: No such file"):
        load_config(None, environ={"HERDSMAN_CONFIG": str(missing)}, cwd=places["cwd"].parent)


def test_nothing_found_is_one_line_listing_the_places(tmp_path: Path) -> None:
    environ = {"XDG_CONFIG_HOME": str(tmp_path / "xdg")}
    with pytest.raises(ConfigError) as caught:
        find_config_file(None, environ, tmp_path)
    assert str(caught.value) == (
        "no configuration file found (looked at -c FILE, $HERDSMAN_CONFIG, "
        f"{tmp_path / 'supervisor.toml'}, {tmp_path / 'xdg/herdsman/supervisor.toml'}); "
        "pass -c FILE or copy supervisor.toml.example to one of those places"
    )
