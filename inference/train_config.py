"""How to train: :class:`TrainConfig`, the settings of the library's one trainer
(:func:`pyrogp_models.inference.trainer.train`), and the default settings of every fit.

Plain values with no torch in them, so that the command line quotes the defaults in its help
without importing the libraries that train.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

OPTIMIZERS = ("adam", "lbfgs")


@dataclass
class TrainConfig:
    """How to train.

    ``steps`` is the maximum number of optimiser steps; ``tol``/``window`` the convergence test
    (None: run all steps); ``natural_gradient_lr`` the step size γ of a natural-gradient step on
    every q(u) before each optimiser step (None: q(u) is optimised with the other parameters);
    ``time_budget`` a limit in seconds; ``pin``: independent members under the batched L-BFGS
    end pinned at their optimum (:meth:`~pyrogp_models.inference.batched_lbfgs.BatchedLBFGS.pinned`)
    once they pass the change test (``False``: the change test alone, e.g. to screen restarts);
    ``global_param_store`` trains in Pyro's global parameter store (and leaves the parameters
    there) instead of in the model only; ``patience``: stop once that many windows in a row end
    above the lowest window so far — by their mean loss, or by a precise loss at their ends when
    the caller of :func:`~pyrogp_models.inference.trainer.train` gives one — and return to the
    parameters at the end of that lowest window (None: no such stop) — for a stochastic
    objective whose loss can rise for hundreds of steps under a fixed learning rate.
    """

    optimizer: str = "adam"
    lr: float = 0.05
    steps: int = 1000
    tol: float | None = 1e-6
    window: int = 50
    seed: int | None = 0
    progress: bool = False
    checkpoint: str | Path | None = None
    checkpoint_every: int = 500
    resume: bool = False
    natural_gradient_lr: float | None = None
    time_budget: float | None = None
    pin: bool = True
    global_param_store: bool = False
    patience: int | None = None

    def __post_init__(self):
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"unknown optimizer '{self.optimizer}'; choose adam or lbfgs")
        gamma = self.natural_gradient_lr
        if gamma is not None and not 0.0 < gamma <= 1.0:
            raise ValueError(f"natural_gradient_lr must be in (0, 1], got {gamma}")
        if self.steps < 0 or self.window < 1:
            raise ValueError(f"steps must be ≥ 0 and window ≥ 1, got {self.steps}, {self.window}")
        if self.patience is not None and self.patience < 1:
            raise ValueError(f"patience must be ≥ 1 window, got {self.patience}")

    @property
    def one_training(self) -> bool:
        """Whether the configuration belongs to one training: a checkpoint or a time budget
        (no restarts, no fit in parts)."""
        return self.checkpoint is not None or self.time_budget is not None


#: Starts per partition (local fits) or per fit (exact experts) by default: the fit goes on from
#: the best (:mod:`pyrogp_models.inference.restarts`).
DEFAULT_RESTARTS = 3
#: Starts of a distributed-kernel fit on its collapsed bound by default: the rule's lengthscale
#: and one a quarter as long (:func:`pyrogp_models.inference.distributed_kernel_fit.
#: start_factors`); the rule's alone settled on a 26-year trend of the US personal saving rate
#: (ELBO −123) where the shorter start explains the structure (ELBO −9.9).
DISTRIBUTED_KERNEL_RESTARTS = 2
#: The exact experts' shortest start, in multiples of the inputs' spacing
#: (:func:`pyrogp_models.inference.restarts.exact_restart_scales`).
SPACING_MULTIPLE = 10.0
#: Gaussian likelihoods (local fits, meta-GPs, a multitask iGP's tasks): the collapsed bound,
#: fitted by L-BFGS with one memory and one step length per independent member
#: (:mod:`pyrogp_models.inference.batched_lbfgs`), stopping when every member's bound changes by
#: less than 1e-6 (relative) over 10 iterations, at most 3000 (composite kernels and many inputs
#: take 500–2500: Mauna Loa CO2 with a five-part kernel ~860 in one partition, Boston housing's
#: 13 inputs 900, its meta-GP 1020; a multitask iGP on gilgai's 4 × 365 rows 120).
COLLAPSED_CONFIG = TrainConfig(optimizer="lbfgs", lr=1.0, steps=3000, window=10, tol=1e-6)
#: The uncollapsed bound otherwise (minibatches, a Gaussian likelihood asked for uncollapsed, the
#: categorical; a softmax's Monte Carlo expectation without the steps): a unit natural-gradient
#: step on every q(u)
#: (exact for Gaussian terms, safeguarded otherwise) before each Adam step on the other
#: parameters.
UNCOLLAPSED_CONFIG = TrainConfig(optimizer="adam", lr=0.05, steps=1000, window=50, tol=1e-6,
                                 natural_gradient_lr=1.0)
#: Likelihoods whose uncollapsed bound is smooth and computed exactly (in closed form or by
#: quadrature), so that L-BFGS fits it: :data:`UNCOLLAPSED_EXACT_CONFIG` with full batches. (The
#: categorical's softmax is a Monte Carlo estimate and its robustmax is not smooth: on 200 rows
#: in 3 partitions L-BFGS ran out of its 3000 steps in 160 s where Adam ran out of 1000 in 112 s.)
EXACT_LIKELIHOODS = ("bernoulli", "poisson", "heteroscedastic")
#: The uncollapsed bound of :data:`EXACT_LIKELIHOODS` with full batches: the batched L-BFGS on
#: every parameter, q(u) included, with the collapsed bound's settings. On 559 biopsy rows
#: (Bernoulli, 3 inputs) it reaches the ELBO of natural-gradient steps with Adam (−81.358 both)
#: in 16.6 s against 58.7 s; Poisson, 600 rows in 3 partitions: the same ELBOs in 46.6 s against
#: 142.3 s; heteroscedastic, 600 rows: converged in 1760 steps (559 s on a busy machine) where
#: Adam's loss became infinite at step 190.
UNCOLLAPSED_EXACT_CONFIG = COLLAPSED_CONFIG
#: The natural-gradient step size with minibatches (a unit step would follow one batch's noise).
MINIBATCH_NATURAL_GRADIENT = 0.2
#: Exact experts: L-BFGS on the summed log marginal likelihood (the batched L-BFGS with one
#: member, which reads nothing back to the host), at most 500 iterations (the authors' code runs
#: SciPy L-BFGS-B for 200); it stops when the loss changes by less than 1e-6 (relative) over 10
#: iterations and the hyperparameters are then pinned at the optimum, as the local fits are.
EXPERTS_CONFIG = TrainConfig(optimizer="lbfgs", lr=1.0, steps=500, window=10, tol=1e-6)
#: The distributed kernel's collapsed bound (``method="solve"``): the batched L-BFGS, judged every
#: 10 steps, converged when the bound changes by less than 1e-6 (relative) over them; at most
#: 3000 steps. (Adam at learning rate 0.05 took ~1000 steps to pass a test of 1e-6 over 50 steps on
#: a 5·10⁴-point series; L-BFGS passes this one in about a hundred. Many inputs take longer:
#: Boston housing, 13 inputs, one region of 100, converges at about 2000.)
DISTRIBUTED_KERNEL_COLLAPSED_CONFIG = TrainConfig(optimizer="lbfgs", lr=1.0, steps=3000,
                                                  window=10, tol=1e-6)
#: The distributed kernel's ELBO by SVI (``method="svi"``): Adam at learning rate 0.05 on all
#: parameters, stopping when the ELBO changes by less than 1e-6 (relative) over 50 steps, at most
#: 1000 steps.
DISTRIBUTED_KERNEL_SVI_CONFIG = TrainConfig(optimizer="adam", lr=0.05, steps=1000, window=50,
                                            tol=1e-6)
#: Multitask models with a deterministic objective whose tasks share parameters (a Gaussian cGP,
#: on its collapsed bound): L-BFGS (lr 1, strong Wolfe), at most 500 steps of 20
#: iterations, converged when the ELBO changes by < 1e-7 (relative) over 2 steps.
MULTITASK_SHALLOW_CONFIG = TrainConfig(optimizer="lbfgs", lr=1.0, steps=500, tol=1e-7, window=2)
#: The same where q(u) is optimised with the hyperparameters (a likelihood other than Gaussian: no
#: collapsed bound), converged at < 1e-5 (relative) over 2 steps: L-BFGS moves the thousands of
#: q(u) parameters by 10⁻⁴–10⁻⁵ nats a step for a hundred steps after the predictions settle (a
#: Bernoulli cGP on 399 rows in 3 tasks, R = 2, M = 145: held-out log loss 0.1310 at step 60
#: and 0.1311 at step 158, where a test of 1e-7 stopped it; its ELBO 0.02 nats apart).
MULTITASK_UNCOLLAPSED_CONFIG = replace(MULTITASK_SHALLOW_CONFIG, tol=1e-5)
#: Multitask deep GPs: Adam (lr 0.01) for at most 20000 steps, converged when the mean loss of
#: 100 steps changes by < 1e-4 (relative) beyond twice its standard error, or — back at the best
#: window's parameters — when a window ends with its ELBO, estimated precisely at its end
#: (``fit_multitask_dgp`` gives the trainer its ``estimate_elbo``), below the best so far and its
#: mean loss above the lowest window mean (an mMDGP on gilgai's 4 × 365 rows fell to 1600 by
#: step 300, rose to 1682 by step 600 and settled at 1624 after 1000 steps). On gilgai a deep fit
#: from its shallow start gains 0.05–0.1 nats per 100 steps after step 300 (1e-4 of its loss:
#: 0.18 nats), within 0.01 nats of where 1e-5 stops it 100–200 steps later; on the toys the
#: standard error decides either way. Windows of 50 steps stopped the toys' deep fits early
#: (docs/limits).
MULTITASK_DEEP_CONFIG = TrainConfig(lr=0.01, steps=20000, tol=1e-4, window=100, patience=1)
#: The most inducing inputs a local fit's partition or a meta-GP takes by default: the help
#: texts' copy, without torch at startup, of
#: :data:`pyrogp_models.data.inducing.MAX_DEFAULT_INDUCING`.
MAX_DEFAULT_INDUCING = 100
#: The most a multitask model's process takes by default (every row of the largest task up to
#: this): the copy of :data:`pyrogp_models.models.multitask.options.MAX_DEFAULT_TASK_INDUCING`.
MAX_DEFAULT_TASK_INDUCING = 400
#: ``fit-local`` without ``--partitions`` (k-means, random or contiguous): one partition per this
#: many rows, each with up to 100 inducing inputs by default — one local GP for a table of up to
#: a thousand rows.
DEFAULT_PARTITION_ROWS = 1000
#: ``fit-experts`` without ``--experts`` or ``--points-per-expert``: about this many points per
#: exact expert (a P × P Cholesky per expert and step).
DEFAULT_EXPERT_POINTS = 500
#: The distributed kernel's default layout
#: (:func:`pyrogp_models.inference.distributed_kernel_fit.default_layout`): one region per this
#: many rows, each with at least this many inducing inputs.
DEFAULT_REGION_ROWS = 3200
MIN_DEFAULT_INDUCING_PER_REGION = 16
