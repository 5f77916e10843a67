"""Exceptions raised by pyrogp_models; each message is one user-facing line naming the problem."""

from __future__ import annotations

from collections.abc import Sequence


class PyrogpError(Exception):
    """Base class of every error this library raises on purpose."""


class DataError(PyrogpError, ValueError):
    """Bad input data: missing file, unknown column, NaN/inf, bad labels, empty partition."""


class UnroutableModulesError(DataError):
    """Several modules with no region for each point (a random partition, or no partition rule
    stored with them): they predict together only when combined by a product-of-experts rule
    (:class:`~pyrogp_models.models.experts.predictor.ExpertCombination`). ``reason`` is the
    message without that advice, so that a front end can word its own (the command line names
    its ``--rule`` flag)."""

    def __init__(self, reason: str):
        super().__init__(f"{reason}; combine them by a product-of-experts rule "
                         "(ExpertCombination) instead")
        self.reason = reason


class ModuleFileError(PyrogpError):
    """A module file is missing, corrupted, tampered with or invalid; the message names the file."""


class IncompatibleModulesError(PyrogpError):
    """Modules that cannot be combined (different kernels, input dimensions, likelihoods, ...)."""


class MixedLikelihoodsError(IncompatibleModulesError):
    """Modules with different likelihoods (names or options) recycled without naming the one to
    export. ``found`` describes what differs (e.g. "gaussian, poisson"), so that a front end can
    word its own advice (the command line names its flag)."""

    def __init__(self, message: str, found: str = ""):
        super().__init__(message)
        self.found = found


class CholeskyError(PyrogpError):
    """A Cholesky factorisation failed even after adding the largest jitter."""


class UnboundedBoundError(PyrogpError):
    """The ensemble bound of a meta-GP is unbounded above: its precision Λ_w has a non-positive
    eigenvalue (under-fitted or overlapping modules, or a global kernel unlike the modules').

    ``smallest`` is λ_min(Λ_w) and ``modules`` names the under-fitted modules (site precision
    indefinite), so that a front end can word its own advice (the command line names its flag).
    """

    def __init__(self, message: str, smallest: float | None = None,
                 modules: Sequence[str] = ()):
        super().__init__(message)
        self.smallest = smallest
        self.modules = list(modules)


class NotConvergedWarning(UserWarning):
    """A fit stopped at its step limit (or time budget) before its convergence test passed.

    ``steps`` is where it stopped, ``change`` the relative change of the loss over the last
    window (the largest over independent members), ``tolerance`` the test's threshold and
    ``members`` how many of the independent members (partitions) had not converged."""

    def __init__(self, message: str, steps: int, change: float, tolerance: float,
                 members: int = 0):
        super().__init__(message)
        self.steps, self.change, self.tolerance, self.members = steps, change, tolerance, members


class ConstantFitWarning(UserWarning):
    """A fit whose ELBO is no higher than the log likelihood of the best constant per task
    (:meth:`~pyrogp_models.likelihoods.base.Likelihood.constant_log_likelihood`): it has learnt
    nothing from its inputs. ``elbo`` and ``constant`` are the two figures."""

    def __init__(self, message: str, elbo: float, constant: float):
        super().__init__(message)
        self.elbo, self.constant = elbo, constant


class RoundingWarning(UserWarning):
    """A fit's bound ended above what no ELBO reaches (its likelihood's
    :meth:`~pyrogp_models.likelihoods.base.Likelihood.log_likelihood_ceiling`): the value is
    rounding error, not a fit. ``partitions`` lists them; their modules are marked not
    converged."""

    def __init__(self, message: str, partitions: Sequence[int] = ()):
        super().__init__(message)
        self.partitions = list(partitions)


class CandidateDroppedWarning(UserWarning):
    """A candidate of a compared fit (a default cGP's rank and noise) was left out: its fit to
    a held-out fold failed."""
