"""Check raw TOML data against the model, collecting every problem with its location.

The walk follows the model's fields (see :mod:`herdsman.config.model`); each
problem is located at the key (unknown keys), the value (wrong values) or the
enclosing table's header (missing keys), in the file or at the ``--set``
argument that supplied it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import attrs

from herdsman.config.keypath import KeyPath, format_key_path
from herdsman.config.kinds import ArrayOfTables, Invalid, Kind, Table
from herdsman.config.overrides import Override
from herdsman.config.positions import PositionIndex
from herdsman.config.problems import ConfigProblem, Location, Origin
from herdsman.config.resolve import unknown_key_message

__all__ = ["Checker", "unknown_key_message"]

At = Literal["key", "value", "header"]


class Checker:
    """One validation pass: collects problems, normalised leaf values and their origins."""

    def __init__(
        self,
        source: str,
        positions: PositionIndex,
        base_dir: Path,
        environ: Mapping[str, str],
        overrides: Sequence[Override] = (),
    ) -> None:
        self.source = source
        self.positions = positions
        self.base_dir = base_dir
        self.environ: Mapping[str, str] = environ
        self.overrides = overrides
        self.problems: list[ConfigProblem] = []
        self.values: dict[KeyPath, Any] = {}
        self.origins: dict[KeyPath, Origin] = {}
        self.toml_values: dict[KeyPath, Any] = {}

    def problem(self, path: KeyPath, message: str, at: At = "value") -> None:
        """Record that the value (or key, or table header) at ``path`` is wrong."""
        self.problems.append(ConfigProblem(self.locate(path, at), format_key_path(path), message))

    def locate(self, path: KeyPath, at: At = "value") -> Location:
        """Where ``path`` was written: an override that supplied it, else its file position."""
        for override in reversed(self.overrides):  # the last --set of a key wins
            if path[: len(override.path)] == override.path:
                return Location.override(override.text, override.index)
        lookup = {"key": self.positions.key, "value": self.positions.value}.get(
            at, self.positions.header
        )
        position = lookup(path) or self.positions.value(path)
        if position is not None:
            return Location.in_file(self.source, *position)
        for override in self.overrides:  # a table that only a --set created
            if override.path[: len(path)] == path:
                return Location.override(override.text, override.index)
        for end in range(len(path) - 1, 0, -1):
            position = self.positions.header(path[:end])
            if position is not None:
                return Location.in_file(self.source, *position)
        return Location.in_file(self.source, 1, 1)

    def where(self, path: KeyPath) -> str:
        """``path`` and its location, for messages that point at another place."""
        return f"{format_key_path(path)} ({self.locate(path)})"

    def value_of(self, path: KeyPath) -> Any:
        """A normalised leaf value checked earlier in this pass (``None`` if invalid)."""
        return self.values.get(path)

    def origin(self, path: KeyPath, written: bool) -> Origin:
        """Where the effective value at ``path`` came from."""
        if not written:
            return Origin("default")
        for override in self.overrides:
            if override.path[: len(path)] == path or path[: len(override.path)] == override.path:
                return Origin("override")
        position = self.positions.value(path)
        return Origin("file", self.source, position[0] if position else 0)

    def check_table(self, kind: Table, raw: object, path: KeyPath) -> dict[str, Any] | None:
        """Check a table against ``kind.cls``; return its normalised fields or ``None``."""
        if not isinstance(raw, Mapping):
            self.problem(path, str(kind.fail(raw)))
            return None
        fields = attrs.fields(kind.cls)
        names = [field.name for field in fields]
        for key in raw:
            if key not in names:
                self.problem((*path, key), unknown_key_message(key, names), "key")
        out: dict[str, Any] = {}
        for field in fields:
            field_kind: Kind = field.metadata["kind"]
            field_path = (*path, field.name)
            written = field.name in raw
            if written:
                value = self._check_value(field_kind, raw[field.name], field_path)
            elif not field_kind.leaf:
                # An absent table is checked as an empty one, so its defaults
                # apply and its own rules (at least one provider) still hold.
                empty: object = [] if isinstance(field_kind, ArrayOfTables) else {}
                value = self._check_value(field_kind, empty, field_path)
            elif field.metadata["default_from"] is not None:
                value = field.metadata["default_from"](self)
            elif isinstance(field.default, attrs.Factory):  # type: ignore[arg-type]
                value = field.default.factory()
            elif field.default is not attrs.NOTHING:
                value = field.default
            else:
                self.problem(
                    path, f"missing required key '{field.name}' ({field_kind.expected})", "header"
                )
                continue
            if value is _INVALID:
                continue
            out[field.name] = value
            if field_kind.leaf:
                self.values[field_path] = value
                self.toml_values[field_path] = field_kind.to_toml(value)
                self.origins[field_path] = self.origin(field_path, written)
        if kind.post is not None:
            kind.post(raw, out, path, self)
        return out

    def _check_value(self, kind: Kind, raw: object, path: KeyPath) -> Any:
        try:
            value = kind.check(raw, path, self)
        except Invalid as error:
            if str(error):  # an empty message means the parts were reported already
                self.problem(path, str(error))
            return _INVALID
        return _INVALID if value is None and not kind.leaf else value


_INVALID: Any = object()
