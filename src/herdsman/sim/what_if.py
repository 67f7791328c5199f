"""``--set`` on a trace's own configuration: its mistakes named as the flags the user wrote.

``sim replay`` and ``sim generate`` take the configuration in a trace's
header and let ``--set KEY=VALUE`` change it. A header the simulator refuses
on its own is the trace's fault, and the error names the trace and its line;
a value a ``--set`` brought in is the user's, and the error names that flag,
as ``-c FILE --set ...`` does — never the trace, which is fine.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from herdsman.config import LoadedConfig
from herdsman.config.overrides import parse_override
from herdsman.sim.workload import config_from_trace
from herdsman.trace import TraceFormatError

__all__ = ["SetError", "header_config"]


class SetError(ValueError):
    """A ``--set`` that the trace's configuration refuses, or that is malformed."""


def header_config(
    config: Mapping[str, Any], name: str, overrides: Sequence[str] = ()
) -> LoadedConfig:
    """The configuration of a trace header, validated, with ``overrides`` applied.

    ``name`` says where the header is (``TRACE:1``): a header refused on its
    own raises :class:`TraceFormatError` naming it. A malformed ``--set``
    raises :class:`SetError` naming that flag; a value the configuration
    refuses, one naming the flags given (every one: two may only make sense
    together, such as a new provider's ``exec`` and its ``concurrency``) and
    the key.
    """
    loaded = config_from_trace(config, name)
    if not overrides:
        return loaded
    for index, text in enumerate(overrides):
        try:
            parse_override(text, index)
        except ValueError as error:
            raise SetError(f"--set {text}: {error}") from None
    flags = " ".join(f"--set {text}" for text in overrides)
    try:
        return config_from_trace(config, flags, overrides)
    except TraceFormatError as error:
        raise SetError(str(error).replace(f"{flags}: config: ", f"{flags}: ", 1)) from None
