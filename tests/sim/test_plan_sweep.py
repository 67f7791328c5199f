"""``--vary``: ranges, lists, the number of accounts, and errors naming the flag."""

from __future__ import annotations

import pytest
from sim_workloads import config_json

from herdsman.sim.sweep import SweepError, configure, parse_vary, settings


def test_a_range_and_a_list_multiply_in_flag_order() -> None:
    varies = [
        parse_vary("providers.claude.concurrency=1..3"),
        parse_vary("supervisor.max_concurrency=4,8"),
    ]
    combos = settings(varies)
    assert [tuple(v for _, v in s) for s in combos] == [
        ("1", "4"), ("1", "8"), ("2", "4"), ("2", "8"), ("3", "4"), ("3", "8"),
    ]  # fmt: skip
    loaded = configure(config_json(), varies, combos[3])
    assert loaded.config.providers["claude"].concurrency == 2
    assert loaded.config.supervisor.max_concurrency == 8


def test_the_number_of_accounts_keeps_the_first_and_copies_the_last() -> None:
    vary = parse_vary("providers.claude.accounts=1..4")
    counts = {}
    for setting in settings([vary]):
        accounts = configure(config_json(), [vary], setting).config.providers["claude"].accounts
        counts[setting[0][1]] = [a.name for a in accounts]
        assert all(a.concurrency is None for a in accounts[1:])  # copies of "spare"
    assert counts == {
        "1": ["work"],
        "2": ["work", "spare"],
        "3": ["work", "spare", "spare-3"],
        "4": ["work", "spare", "spare-3", "spare-4"],
    }
    # A provider that declares none gets plain accounts.
    codex = parse_vary("providers.codex.accounts=2")
    loaded = configure(config_json(), [codex], settings([codex])[0])
    assert [a.name for a in loaded.config.providers["codex"].accounts] == ["a1", "a2"]


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        ("providers.claude.concurrency", "--vary providers.claude.concurrency: expected KEY=RANGE"),
        ("providers..x=1", "--vary providers..x=1: malformed key"),
        ("providers.claude.concurrency=8..1", "the range 8..1 is empty: write it low..high"),
        ("providers.claude.concurrency=1,,2", "an empty value in '1,,2'"),
        ("providers.claude.concurrency=1,1", "a value is given twice in '1,1'"),
        ("providers.claude.accounts=0..2", "accounts must be a whole number >= 1, got '0'"),
        ("providers.claude.accounts=two", "a number of accounts must be a whole number >= 1"),
    ],
)  # fmt: skip
def test_a_malformed_vary_names_the_flag(flag: str, message: str) -> None:
    with pytest.raises(SweepError, match=message.replace("(", r"\(").replace(".", r"\.")):
        parse_vary(flag)


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        ("providers.claude.concurrency=0",
         "--vary providers.claude.concurrency=0: providers.claude.concurrency: must be a whole"
         " number from 1 to 64, got 0"),
        ("providers.claude.concurency=2",
         "--vary providers.claude.concurency=2: providers.claude.concurency: unknown key;"
         " did you mean 'concurrency'?"),
        ("providers.gemini.accounts=2",
         "--vary providers.gemini.accounts: no provider 'gemini' in the configuration"
         " (it has claude, codex)"),
    ],
)  # fmt: skip
def test_a_value_the_configuration_refuses_names_key_and_value(flag: str, message: str) -> None:
    vary = parse_vary(flag)
    with pytest.raises(SweepError) as info:
        configure(config_json(), [vary], settings([vary])[0])
    assert str(info.value) == message


def test_a_key_varied_twice_is_refused() -> None:
    twice = [parse_vary("supervisor.max_concurrency=1"), parse_vary("supervisor.max_concurrency=2")]
    with pytest.raises(SweepError, match="a key is varied twice"):
        settings(twice)
