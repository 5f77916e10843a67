"""Which modules of a set to look at: ELBO-per-point outliers among siblings, unconverged fits.

A module's ELBO divided by its number of points is comparable across the partitions of one fit.
A module is an *outlier* when its ELBO per point lies more than :data:`OUTLIER_Z` robust
standard deviations below the median of its siblings (robust: 1.4826 × the median absolute
deviation, floored at :data:`MIN_SPREAD` nats per point so that near-identical siblings do not
flag each other); at least :data:`MIN_SIBLINGS` modules are needed to judge. A module is
*unconverged* when its fit recorded ``info["converged"] = False``.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from pyrogp_models.modules.record import Module

#: How many robust standard deviations below its siblings' median ELBO per point flag a module.
OUTLIER_Z = 5.0
#: The smallest robust spread of the siblings' ELBO per point, in nats per point.
MIN_SPREAD = 0.05
#: The fewest modules in a set for the outlier test to judge.
MIN_SIBLINGS = 5


def elbo_per_point(modules: Mapping[str, Module]) -> np.ndarray:
    """ELBO / N of every module, in dictionary order."""
    return np.array([m.elbo / max(m.num_data, 1) for m in modules.values()], dtype=np.float64)


def module_flags(modules: Mapping[str, Module]) -> dict[str, list[str]]:
    """Per module name, its flags: ``"outlier"`` and/or ``"not converged"`` (module docstring);
    modules without flags are left out."""
    values = elbo_per_point(modules)
    outliers = np.zeros(len(values), dtype=bool)
    if len(values) >= MIN_SIBLINGS:
        median = np.median(values)
        spread = max(1.4826 * np.median(np.abs(values - median)), MIN_SPREAD)
        outliers = values < median - OUTLIER_Z * spread
    flags: dict[str, list[str]] = {}
    for (name, module), outlier in zip(modules.items(), outliers, strict=True):
        found = (["outlier"] if outlier else []) + (
            ["not converged"] if module.info.get("converged") is False else [])
        if found:
            flags[name] = found
    return flags
