"""Names of top-level Pyro modules that never collide in Pyro's global parameter store.

A :class:`~pyro.nn.PyroModule`'s parameters are stored under ``<name>.<attribute>``; two models
built with the same name in one process would silently share them whenever the global parameter
store is used (Pyro's default). Every model therefore takes a fresh name unless one is given:
the first model called ``"meta"`` keeps that name, the next one becomes ``"meta_2"``, and so on.
"""

from __future__ import annotations

import itertools
from collections import defaultdict

_COUNTERS: defaultdict[str, itertools.count] = defaultdict(lambda: itertools.count(1))


def unique_name(base: str) -> str:
    """``base`` the first time, then ``base_2``, ``base_3``, … (per process)."""
    number = next(_COUNTERS[base])
    return base if number == 1 else f"{base}_{number}"
