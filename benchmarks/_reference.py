"""The reference operation: a fixed piece of work timed next to every guarded measurement.

A benchmark time divided by the reference time measured in the same run (the *figure*, in units
of the reference) does not change when the whole machine is slower or busier, so figures from
different runs and machines compare where seconds do not. The work mixes what the library's
objectives are made of, in about equal parts of time: thin float64 products over many columns
(the meta-GP's Gram steps), an elementwise exponential over a large array (kernel matrices),
batched Cholesky factorisations of small matrices (the local fits' priors) and a run of small
operations whose cost is the dispatcher's and Python's (the M × M algebra of every step).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch


def reference_operation() -> Callable[[], torch.Tensor]:
    """A callable doing the reference work (a few milliseconds on one thread), its inputs built
    once here, deterministic."""
    generator = torch.Generator().manual_seed(0)
    thin = torch.randn(35, 4096, generator=generator, dtype=torch.float64)
    square = torch.randn(35, 35, generator=generator, dtype=torch.float64)
    exponent = -torch.rand(65536, 8, generator=generator, dtype=torch.float64)
    roots = torch.randn(4000, 8, 8, generator=generator, dtype=torch.float64)
    spd = roots @ roots.mT + 8.0 * torch.eye(8, dtype=torch.float64)
    small = torch.randn(8, 8, generator=generator, dtype=torch.float64)

    def run() -> torch.Tensor:
        gram = (square @ thin) @ thin.mT
        exponential = exponent.exp().sum()
        factor = torch.linalg.cholesky(spd).diagonal(dim1=-2, dim2=-1).log().sum()
        total = small
        for _ in range(200):
            total = (total * 0.5 + small).tanh()
        return gram.trace() + exponential + factor + total.sum()

    return run


def reference_seconds(repeats: int = 15) -> float:
    """Median CPU seconds of one reference operation in this process (after one warm-up)."""
    run = reference_operation()
    run()
    times = []
    for _ in range(repeats):
        start = time.process_time()
        run()
        times.append(time.process_time() - start)
    return statistics.median(times)
