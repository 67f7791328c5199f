"""Completion callbacks: POST the finished run to the URL its submitter gave."""

from __future__ import annotations

import logging

import httpx
import trio

from herdsman.runtime.store import RunRecord
from herdsman.runtime.views import run_view

log = logging.getLogger("herdsman.callbacks")

#: Delays before the 2nd, 3rd, ... attempt; bounded so a dead receiver costs
#: one short-lived task, never the scheduler's attention.
BACKOFF = (1.0, 2.0, 4.0, 8.0, 16.0)
TIMEOUT = 10.0


async def deliver_callback(record: RunRecord, *, backoff: tuple[float, ...] = BACKOFF) -> bool:
    """POST the run as JSON to its ``callback_url``; retry on failure.

    Returns whether a 2xx answer arrived. Runs as its own task, so a slow or
    failing receiver never blocks scheduling.
    """
    assert record.callback_url is not None
    payload = dict(run_view(record))
    async with httpx.AsyncClient(timeout=TIMEOUT) as client:
        for attempt, delay in enumerate((0.0, *backoff), start=1):
            await trio.sleep(delay)
            try:
                response = await client.post(record.callback_url, json=payload)
            except httpx.HTTPError as exc:
                log.warning("callback for %s, attempt %d: %s", record.id, attempt, exc)
                continue
            except Exception as exc:  # a URL httpx cannot use: retrying will not help
                log.error("callback for %s cannot be sent: %s", record.id, exc)
                return False
            if response.is_success:
                return True
            log.warning(
                "callback for %s, attempt %d: HTTP %d", record.id, attempt, response.status_code
            )
    log.error("callback for %s gave up after %d attempts", record.id, len(backoff) + 1)
    return False
