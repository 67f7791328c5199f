"""PostgreSQL URLs: what libpq reads from one, and showing one without its password."""

from __future__ import annotations

import pytest

from herdsman.postgres_url import hide_password, masked_url, parse_postgres_url, server_name


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        # A password equal to the user's name hides the password only.
        (
            "postgresql://herdsman:herdsman@db:5432/herdsman",
            "postgresql://herdsman:***@db:5432/herdsman",
        ),
        ("postgresql://u:p%40w@db/d", "postgresql://u:***@db/d"),
        ("postgresql://db/d?a=1&password=pw&b=2", "postgresql://db/d?a=1&password=***&b=2"),
        ("postgresql://u@db/d", "postgresql://u@db/d"),
        ("postgresql://u:@db/d", "postgresql://u:@db/d"),
        # libpq decodes parameter keys: this is the password too.
        ("postgresql://u@db/d?pass%77ord=pw&a=1", "postgresql://u@db/d?pass%77ord=***&a=1"),
        ("postgresql://u@db/d?passwords=pw", "postgresql://u@db/d?passwords=pw"),
    ],
)
def test_a_url_is_shown_without_its_password(url: str, shown: str) -> None:
    assert masked_url(url) == shown


def test_every_copy_of_the_password_is_hidden_from_a_message() -> None:
    url = "postgresql://u:p%40ss@db/d?password=other"
    text = "failed for p%40ss, p@ss and other"
    assert hide_password(text, url, "p@ss") == "failed for ***, *** and ***"


def test_a_password_behind_an_encoded_key_is_hidden_from_a_message() -> None:
    url = "postgresql://u@db/d?pass%77ord=s%65cret"
    assert parse_postgres_url(url)["password"] == "secret"
    text = "failed for s%65cret and secret"
    assert hide_password(text, url) == "failed for *** and ***"


def test_what_libpq_reads_and_how_messages_name_the_server() -> None:
    params = parse_postgres_url("postgresql://u:pw@db.example:6543/ledger?sslmode=require")
    assert params == {
        "user": "u",
        "password": "pw",
        "host": "db.example",
        "port": "6543",
        "dbname": "ledger",
        "sslmode": "require",
    }
    assert server_name(params) == "PostgreSQL server db.example port 6543, database 'ledger'"
    socket = parse_postgres_url("postgresql:///ledger?host=/run/postgresql")
    assert server_name(socket) == "PostgreSQL server /run/postgresql port 5432, database 'ledger'"


def test_a_url_libpq_refuses_is_explained_without_the_password() -> None:
    with pytest.raises(ValueError, match="invalid URI query parameter") as caught:
        parse_postgres_url("postgresql://u:hunter2@db/d?nonsense=1")
    assert "hunter2" not in str(caught.value)
    assert "postgresql://u:***@db/d?nonsense=1" in str(caught.value)
