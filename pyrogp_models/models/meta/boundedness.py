"""The boundedness guard of the meta-GPs' ensemble bound (Recyclable GPs, eq. 6).

The ensemble bound is not a true bound: as a function of the whitened q(v) it is a quadratic form
with precision Λ_w = I + Σ_k B_k P_k B_kᵀ (:mod:`pyrogp_models.gaussian.expectations`), unbounded
above when λ_min(Λ_w) ≤ 0 — under-fitted or overlapping modules, or a global kernel unlike the
modules'. The guard checks λ_min(Λ_w) before training and every ``check_every`` evaluations (on
the Λ_w the evaluation computes anyway, so the check costs one eigenvalue problem and one value
read back per window), raising :class:`~pyrogp_models.errors.UnboundedBoundError` or warning.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence

import torch

from pyrogp_models.errors import DataError, UnboundedBoundError
from pyrogp_models.gaussian.linalg import checks_deferred

#: What to do when λ_min(Λ_w) ≤ 0.
ON_UNBOUNDED = ("raise", "warn")
#: Below float64, the largest ε·cond(Λ_w) accepted (float32: a condition number of 840; at
#: 3·10⁴ a float32 fit of sine modules with noise 0.1 went NaN, at 3·10⁶ its eigensolver failed).
RESOLVED_ERROR = 1e-4


class UnboundedBoundWarning(UserWarning):
    """Warning counterpart of :class:`UnboundedBoundError` (``on_unbounded="warn"``), with the
    same ``smallest`` and ``modules``."""

    def __init__(self, message: str, smallest: float | None = None,
                 modules: Sequence[str] = ()):
        super().__init__(message)
        self.smallest = smallest
        self.modules = list(modules)


def describe_unbounded(smallest: float | None, suspects: Sequence[str]) -> str:
    """What an :class:`UnboundedBoundError` found, in one line without advice (front ends add
    their own): λ_min(Λ_w) and the under-fitted modules, at most five by name."""
    value = f"λ_min(Λ_w) = {smallest:.4g} ≤ 0: " if smallest is not None else ""
    named = (f"; modules wider than their prior (under-fitted): "
             f"{', '.join(suspects[:5])}{' and more' if len(suspects) > 5 else ''}"
             if suspects else "")
    return (f"the ensemble bound is unbounded above ({value}under-fitted or overlapping "
            f"modules, or a global kernel unlike the modules'){named}")


class BoundednessGuard:
    """λ_min(Λ_w) checks shared by the meta-GPs. A user class provides ``bound_quadratic()``,
    ``_unbounded_message(λ_min, suspects)`` and the attributes ``on_unbounded``, ``check_every``,
    ``evaluations`` and ``collapsed`` (and may name suspect modules in ``_unbounded_suspects()``);
    a collapsed model always raises (its optimum does not exist)."""

    def _unbounded_suspects(self) -> list[str]:
        """Modules to name when the bound is unbounded (none by default)."""
        return []

    def _unbounded_error(self, smallest: float) -> UnboundedBoundError:
        suspects = self._unbounded_suspects()
        return UnboundedBoundError(self._unbounded_message(smallest, suspects), smallest,
                                   suspects)

    @torch.no_grad()
    def min_precision_eigenvalue(self, precision: torch.Tensor | None = None) -> float:
        """λ_min(Λ_w) (of ``precision`` when given, else of the current Λ_w); the bound is bounded
        above in q iff it is positive."""
        return self._precision_eigenvalues(precision)[0]

    @torch.no_grad()
    def _precision_eigenvalues(self, precision: torch.Tensor | None = None
                               ) -> tuple[float, float, torch.dtype]:
        """λ_min and λ_max of Λ_w (eigenvalues in float64, which also resolve a float32 Λ_w) and
        the dtype Λ_w was assembled in."""
        if precision is None:
            precision = self.bound_quadratic().precision
        dtype, precision = precision.dtype, precision.detach().to(torch.float64)
        if not bool(torch.isfinite(precision).all()):
            return math.nan, math.nan, dtype
        values = torch.linalg.eigvalsh(precision)
        return float(values[0]), float(values[-1]), dtype

    def check_bounded(self, precision: torch.Tensor | None = None) -> float:
        """Raise :class:`UnboundedBoundError` (or warn) if λ_min(Λ_w) ≤ 0; returns λ_min.
        ``precision``: Λ_w if already computed. Below float64, Λ_w whose condition number
        exceeds :data:`RESOLVED_ERROR`/ε of its dtype (rounding alone can make λ_min ≤ 0) is
        refused with a :class:`~pyrogp_models.errors.DataError` that names the dtype, not as
        unbounded. A non-finite Λ_w is left to the trainer, which names the step."""
        smallest, largest, dtype = self._precision_eigenvalues(precision)
        if math.isnan(smallest):
            return smallest
        epsilon = torch.finfo(dtype).eps
        if dtype != torch.float64 and smallest <= largest * epsilon / RESOLVED_ERROR:
            raise DataError(
                f"in {str(dtype).removeprefix('torch.')} the meta-GP's precision Λ_w is not "
                f"resolved (condition number {largest / max(smallest, largest * epsilon):.2g}, "
                f"more than {RESOLVED_ERROR:g}/ε = {RESOLVED_ERROR / epsilon:.2g}): these "
                "modules are too precise for it; recycle them in float64")
        if smallest > 0:
            return smallest
        error = self._unbounded_error(smallest)
        if self.on_unbounded == "raise" or self.collapsed:
            raise error
        warnings.warn(UnboundedBoundWarning(str(error), error.smallest, error.modules),
                      stacklevel=2)
        return smallest

    def precision_cholesky(self, precision: torch.Tensor) -> torch.Tensor:
        """chol(Λ_w), raising :class:`UnboundedBoundError` if Λ_w is not positive definite
        (inside deferred checks: NaN, found by the trainer's next look at the loss)."""
        chol, info = torch.linalg.cholesky_ex(precision)
        if checks_deferred():
            return torch.where(info > 0, torch.nan, chol)
        if bool(info > 0):
            raise self._unbounded_error(float(torch.linalg.eigvalsh(precision.detach())[0]))
        return chol

    def guard_evaluation(self, precision: Callable[[], torch.Tensor] | None = None) -> None:
        """Called at every evaluation of the model: check before the first one and then every
        ``check_every``. ``precision``: returns Λ_w when the evaluation has it at hand (called
        only when a check is due)."""
        if self.evaluations % self.check_every == 0:
            self.check_bounded(precision() if precision is not None else None)
        self.evaluations += 1
