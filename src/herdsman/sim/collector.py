"""The cyclic garbage collector paced for a simulation, which keeps nearly all it makes."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

__all__ = ["YOUNG_COLLECTIONS_RARER", "young_collections_rarer"]


#: How many times as many allocations the cyclic collector lets pass
#: between its collections of the youngest generation while a simulation runs.
YOUNG_COLLECTIONS_RARER = 100


@contextlib.contextmanager
def young_collections_rarer() -> Iterator[None]:
    """The cyclic garbage collector's youngest generation collected 100 times less often.

    A replay keeps nearly every container it makes (its ledger's records,
    the input's arrivals) and makes almost no cyclic garbage: about 1,000
    objects a 100,000-run replay, all found by the default thresholds. Yet
    those thresholds (700 net allocations a young collection, every tenth
    one an older, and a full one once the survivors grew by a quarter) made
    it traverse every live object again and again: the two full collections
    of a 100,000-run replay cost 4% of its time, each object visited a
    cache miss (docs/simulator.md). Rarer young collections still find
    that garbage; the older generations, each collected after every tenth
    collection of the one below, come 100 times rarer too. A plan's worker
    is the same: building a replication keeps every arrival and attempt it
    makes, and the default thresholds spent about as long on full
    collections as on the building (docs/capacity-planning.md). The
    thresholds are the process's own: they are put back afterwards.
    """
    thresholds = gc.get_threshold()
    gc.set_threshold(thresholds[0] * YOUNG_COLLECTIONS_RARER, *thresholds[1:])
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
