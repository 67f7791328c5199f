"""Validation of what clients submit: every field checked, every error named."""

from __future__ import annotations

import json
import os
from collections.abc import Collection, Mapping
from typing import Any

import attrs
import httpx

from herdsman.core import DEFAULT_WORKSPACE
from herdsman.runtime.ids import id_problem, new_run_id, run_id_problem
from herdsman.runtime.store import NewRun
from herdsman.runtime.supervisor import OnBusy

MAX_PROMPT_BYTES = 1 << 20
MAX_METADATA_BYTES = 16 << 10
MAX_URL_LENGTH = 2048
MAX_BATCH = 1000
MAX_PATH_LENGTH = 4096

SUBMIT_FIELDS = (
    "id",
    "provider",
    "prompt",
    "conversation",
    "agent",
    "workspace",
    "on_busy",
    "callback_url",
    "metadata",
    "cwd",
)
_KNOWN_FIELDS = frozenset(SUBMIT_FIELDS)


@attrs.frozen
class InvalidRequest(Exception):
    """A request the API refuses: ``status`` is the HTTP status to answer with."""

    status: int
    message: str

    def __str__(self) -> str:
        return self.message


def _string(body: Mapping[str, Any], key: str) -> str | None:
    value = body.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidRequest(422, f"{key}: must be a string, got {type(value).__name__}")
    # JSON can carry lone surrogates ("\ud800"); they are not text. ASCII
    # (isascii is O(1)) holds none: no copy to encode for the usual value.
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidRequest(422, f"{key}: must be valid Unicode text") from None
    if "\0" in value:
        # Nor can every ledger hold NUL ("\u0000"): PostgreSQL text cannot.
        raise InvalidRequest(422, f"{key}: must not contain a NUL character")
    return value


def _callback_url(value: str) -> str:
    if len(value) > MAX_URL_LENGTH:
        raise InvalidRequest(422, f"callback_url: at most {MAX_URL_LENGTH} characters")
    try:
        # Parsed exactly as the callback sender will parse it, port included.
        url = httpx.URL(value)
        port = url.port
    except (httpx.InvalidURL, ValueError, UnicodeError) as exc:
        raise InvalidRequest(422, f"callback_url: not a valid URL ({exc})") from None
    if port is not None and not 0 < port < 65536:
        # httpx parses any number of digits; the sender could not connect.
        raise InvalidRequest(422, f"callback_url: the port must be from 1 to 65535, got {port}")
    if url.scheme not in ("http", "https") or not url.host:
        raise InvalidRequest(422, "callback_url: must be an http:// or https:// URL")
    return value


def _working_directory(value: str) -> str:
    """An absolute path, resolved now: symlinks followed, a missing tail kept.

    Resolving at submission is what makes overlap checks mean what they
    say: ``/link/sub`` and ``/repo`` conflict when ``/link`` points at
    ``/repo``.
    """
    if "\0" in value or len(value) > MAX_PATH_LENGTH:
        raise InvalidRequest(422, "cwd: must be a path of at most 4096 characters, no NUL")
    if not os.path.isabs(value):
        raise InvalidRequest(422, f"cwd: must be an absolute path, got {value[:80]!r}")
    return os.path.realpath(value)


def _metadata(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise InvalidRequest(422, "metadata: must be a JSON object")
    if not value:  # most runs carry none: nothing to measure
        return value
    try:
        text = json.dumps(value, allow_nan=False, ensure_ascii=False)
        size = len(text.encode("utf-8"))
    except (ValueError, UnicodeEncodeError, RecursionError):
        raise InvalidRequest(422, "metadata: must be plain JSON (no NaN or Infinity)") from None
    if size > MAX_METADATA_BYTES:
        raise InvalidRequest(422, f"metadata: at most {MAX_METADATA_BYTES} bytes of JSON")
    return value


def parse_submit(body: Any, providers: Collection[str]) -> tuple[NewRun, OnBusy]:
    """Turn a ``POST /v1/runs`` body into a run, or raise :class:`InvalidRequest`."""
    if not isinstance(body, dict):
        raise InvalidRequest(400, "the request body must be a JSON object")
    unknown = sorted(body.keys() - _KNOWN_FIELDS)
    if unknown:
        raise InvalidRequest(
            422, f"{unknown[0]}: unknown field; expected one of {', '.join(SUBMIT_FIELDS)}"
        )

    provider = _string(body, "provider")
    if provider is None:
        raise InvalidRequest(422, "provider: required")
    if provider not in providers:
        known = ", ".join(sorted(providers)) or "none"
        raise InvalidRequest(422, f"provider: unknown provider {provider!r}; configured: {known}")

    prompt = _string(body, "prompt")
    if prompt is None or not prompt.strip():
        raise InvalidRequest(422, "prompt: required and must not be empty")
    size = len(prompt) if prompt.isascii() else len(prompt.encode("utf-8"))
    if size > MAX_PROMPT_BYTES:
        raise InvalidRequest(422, f"prompt: at most {MAX_PROMPT_BYTES} bytes, got {size}")

    run_id = _string(body, "id")
    if run_id is None:
        run_id = new_run_id()
    elif problem := run_id_problem(run_id):
        raise InvalidRequest(422, f"id: {problem}")

    ids: dict[str, str | None] = {}
    for key in ("conversation", "agent", "workspace"):
        value = _string(body, key)
        if value is not None and (problem := id_problem(value)):
            raise InvalidRequest(422, f"{key}: {problem}")
        ids[key] = value

    on_busy = body.get("on_busy", "queue")
    if on_busy not in ("queue", "skip"):
        raise InvalidRequest(422, f'on_busy: must be "queue" or "skip", got {on_busy!r}')

    callback_url = _string(body, "callback_url")
    if callback_url is not None:
        callback_url = _callback_url(callback_url)
    metadata = _metadata(body.get("metadata", {}))
    cwd = _string(body, "cwd")
    if cwd is not None:
        cwd = _working_directory(cwd)

    new = NewRun(
        id=run_id,
        provider=provider,
        prompt=prompt,
        conversation=ids["conversation"],
        agent=ids["agent"],
        workspace=ids["workspace"] or DEFAULT_WORKSPACE,
        callback_url=callback_url,
        metadata=metadata,
        cwd=cwd,
    )
    return new, on_busy


def parse_batch(body: Any, providers: Collection[str]) -> list[tuple[NewRun, OnBusy]]:
    """Turn a ``POST /v1/runs/batch`` body (``{"runs": [...]}``) into runs.

    All or nothing: one invalid run refuses the whole batch, naming its index.
    """
    if not isinstance(body, dict):
        raise InvalidRequest(400, "the request body must be a JSON object")
    unknown = sorted(set(body) - {"runs"})
    if unknown:
        raise InvalidRequest(422, f"{unknown[0]}: unknown field; expected runs")
    runs = body.get("runs")
    if not isinstance(runs, list) or not runs:
        raise InvalidRequest(422, "runs: must be a non-empty list of runs")
    if len(runs) > MAX_BATCH:
        raise InvalidRequest(422, f"runs: at most {MAX_BATCH} runs per batch, got {len(runs)}")
    parsed = []
    for index, run in enumerate(runs):
        try:
            parsed.append(parse_submit(run, providers))
        except InvalidRequest as exc:
            raise InvalidRequest(exc.status, f"runs[{index}].{exc.message}") from None
    return parsed


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        # json.loads keeps the last of a repeated key: which one the client
        # meant is anybody's guess, so neither is taken.
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise InvalidRequest(
                    400,
                    f"the request body has the key {key[:80]!r} twice in one object; give it once",
                )
            seen.add(key)
    return obj


# One decoder for every request: json.loads with an option builds a new one
# per call, which doubled the cost of decoding a small body.
_DECODER = json.JSONDecoder(parse_constant=_reject_constant, object_pairs_hook=_unique_keys)


def load_json(raw: bytes) -> Any:
    """Decode a request body, refusing what JSON does not allow (NaN, Infinity).

    Raises :class:`InvalidRequest` (400) for anything that is not JSON,
    including numbers too long to convert and nesting too deep to parse, and
    for an object that holds a key twice.
    Bytes are decoded as ``json.loads`` decodes them (UTF-8, -16 or -32).
    """
    try:
        return _DECODER.decode(raw.decode(json.detect_encoding(raw), "surrogatepass"))
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise InvalidRequest(400, f"the request body is not valid JSON: {exc}") from None
