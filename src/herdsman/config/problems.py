"""What went wrong and where: locations, problems, origins and the error type."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

import attrs

from herdsman.postgres_url import mask_passwords

__all__ = ["ConfigError", "ConfigProblem", "ConfigUsageError", "Location", "Origin"]


@attrs.frozen(order=True)
class Location:
    """Where a problem sits: a file position, or a ``--set KEY=VALUE`` argument.

    Orders file positions before overrides, then by line, column and the order
    the overrides were given, which is the order problems are reported in.
    """

    source: str
    line: int = 0
    col: int = 0
    override_index: int = -1

    @classmethod
    def in_file(cls, source: str, line: int, col: int) -> Location:
        """A 1-based line and column in the named file."""
        return cls(source, line, col)

    @classmethod
    def override(cls, text: str, index: int) -> Location:
        """The ``index``-th ``--set`` argument, whose text is ``KEY=VALUE``.

        A URL's password in the value is masked: problems are printed, and
        ``store.url`` refuses passwords precisely so they are never shown.
        """
        return cls(f"--set {mask_passwords(text)}", override_index=index)

    @property
    def sort_key(self) -> tuple[int, int, int]:
        """File positions first (by line, column), then overrides in given order."""
        if self.override_index >= 0:
            return (1, self.override_index, 0)
        return (0, self.line, self.col)

    def __str__(self) -> str:
        if self.override_index >= 0 or self.line == 0:
            return self.source
        return f"{self.source}:{self.line}:{self.col}"


@attrs.frozen
class ConfigProblem:
    """One error in a configuration: ``location: key.path: message``."""

    location: Location
    key_path: str
    message: str

    def __str__(self) -> str:
        parts = [str(self.location), self.key_path, self.message]
        return ": ".join(part for part in parts if part)


class ConfigError(Exception):
    """The configuration is invalid; ``problems`` lists every error, in file order."""

    def __init__(self, problems: Iterable[ConfigProblem]) -> None:
        self.problems: list[ConfigProblem] = sorted(problems, key=lambda p: p.location.sort_key)
        super().__init__("\n".join(str(p) for p in self.problems))


class ConfigUsageError(ConfigError):
    """A command named no setting: a malformed or unknown key path, a missing element.

    The file was not looked at beyond finding that; the command line is what
    to fix (``herdsman`` exits 2, as for any usage error).
    """

    @classmethod
    def one(cls, key: str, message: str) -> ConfigUsageError:
        """The error for one key path (``key`` may be empty when ``message`` names it)."""
        return cls([ConfigProblem(Location(""), key, message)])


@attrs.frozen
class Origin:
    """Where an effective value came from: a file line, a default or ``--set``."""

    kind: Literal["file", "default", "override"]
    source: str = ""
    line: int = 0

    def __str__(self) -> str:
        if self.kind == "file":
            return f"{self.source}:{self.line}"
        if self.kind == "override":
            return "--set"
        return "default"
