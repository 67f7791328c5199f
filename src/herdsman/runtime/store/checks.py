"""What every store refuses alike: a negative limit, a time that is not finite, metadata
JSON cannot hold, text a ledger cannot store.

Shared by every store implementation (re-exported by
:mod:`herdsman.runtime.store.records`), so SQLite, PostgreSQL and memory
refuse the same input with the same message.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING

from herdsman.runtime.store.errors import StoreError

if TYPE_CHECKING:
    from herdsman.runtime.store.records import JSON


def check_limit(limit: int) -> None:
    """Refuse a negative listing limit (SQLite would read it as "no limit")."""
    if limit < 0:
        raise StoreError(f"limit must be 0 or more, got {limit}")


def check_now(now: float) -> float:
    """Return ``now`` as a float; refuse NaN and infinities.

    Both stores normalise to float so an ``int`` timestamp reads back as the
    same type from SQLite (which would otherwise keep it an INTEGER) and from
    memory.
    """
    value = float(now)
    if not math.isfinite(value):
        raise StoreError(f"timestamp must be a finite number of seconds, got {now!r}")
    return value


def normalise_metadata(run_id: str, metadata: Mapping[str, JSON]) -> dict[str, JSON]:
    """Return a private copy of ``metadata`` exactly as it reads back from JSON text.

    SQLite persists metadata as JSON text; the in-memory store round-trips it
    the same way so both return equal values (tuples become lists, keys
    become strings) and both refuse what JSON cannot hold (NaN, sets, ...).
    """
    if not metadata:  # most runs carry none: skip the round trip
        return {}
    try:
        text = json.dumps(metadata, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise StoreError(f"metadata of run {run_id!r} is not JSON: {exc}") from exc
    value: dict[str, JSON] = json.loads(text)
    return value


def check_text(run_id: str, **fields: str | None) -> None:
    """Refuse strings a ledger cannot store: lone surrogates and NUL characters.

    They do reach us: JSON may carry ``"\\ud800"`` or ``"\\u0000"``, and
    process output decoded with ``surrogateescape`` holds surrogates. SQLite
    cannot store surrogates and PostgreSQL cannot store NUL in text; every
    store (the in-memory one too) refuses both, so the simulator cannot
    accept what production would reject and a ledger reads the same on
    either database.
    """
    check_texts(run_id, fields)


def check_texts(run_id: str, fields: Mapping[str, str | None]) -> None:
    """:func:`check_text` with the fields given as a mapping (no keyword call to pack them)."""
    _check_utf8(fields, "run {!r}", run_id)


def all_plain(*texts: str | None) -> bool:
    """Whether every one of ``texts`` is plain: ASCII without NUL, or ``None``.

    Every ledger stores plain text, so a record's texts that all are need
    no further check. The usual case, checked over the values alone: the
    field names (a mapping built at every state change) are needed only
    to name a field in an error, by :func:`check_texts`. A value that is
    not text fails here as it fails there.
    """
    for text in texts:
        if text is not None and (not text.isascii() or "\0" in text):
            return False
    return True


def check_limit_text(provider: str, account: str | None, **fields: str | None) -> None:
    """:func:`check_text` for an account limit; also refuse ``""`` as an account name.

    SQLite keys the ambient environment (``account=None``) as ``""``, so an
    account really named ``""`` would read back as ``None``; configured
    account names are never empty, and both stores refuse it alike.
    """
    owner = "the account limit of {!r}/{!r}"
    if account == "":
        raise StoreError(
            f"{owner.format(provider, account)}: an account name must not be empty"
            " (None means ambient)"
        )
    _check_utf8({"provider": provider, "account": account, **fields}, owner, provider, account)


def _check_utf8(fields: Mapping[str, str | None], owner: str, *names: str | None) -> None:
    """Check ``fields``; an error names its owner, ``owner.format(*names)``.

    The owner is formatted only for an error: this runs on every state
    change of every run, and building the name each time was most of its cost.
    """
    for name, value in fields.items():
        if value is None:
            continue
        # ASCII always encodes; only other text may hold lone surrogates.
        if not value.isascii():
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise StoreError(
                    f"{name} of {owner.format(*names)} is not valid UTF-8 text: {exc}"
                ) from None
        if "\0" in value:
            raise StoreError(
                f"{name} of {owner.format(*names)} contains a NUL character"
                f" (at index {value.index(chr(0))}), which the ledger cannot store"
            )
