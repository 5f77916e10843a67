"""The architecture of a multitask (deep) GP: widths, process counts, inducing points, the
estimator's sample size and initial hyperparameters — a JSON-able record (``dataclasses.asdict``)
from which a model and its saved tensors rebuild it.

Defaults follow the spec (Sec. 4.1 and App. B of Boustati et al.):

- one shared process of width W_s and one private process per task of width W_p; the inner
  width W = W_s + W_p (half each for mMDGP) defaults to D_in clipped to [2, 10];
- M inducing points per task: a private process and every task's top GP have M, a shared (or
  coregionalised) process the M·T points of all tasks;
- S = 1 sample in training, inner q_sqrt = 10⁻⁵·I (Salimbeni & Deisenroth 2017);
- Matérn-5/2 everywhere; ARD in the top layer; private kernels start with another variance than
  the shared ones (symmetry breaking, Sec. 2.2);
- the coregionalised models (cGP, cMDGP) mix R = min(T, 2) latent GPs per output (the rank of
  the coregionalisation matrix) and cMDGP mixes Q = W latent GPs into its latent space.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from pyrogp_models.gaussian.linalg import DEFAULT_JITTER
from pyrogp_models.models.multitask.data import MINIBATCHES

INNER_MEANS = ("linear", "zero")
COREGIONALISATIONS = ("icm", "lmc")
#: Default (I, J): shared processes and private processes per task of each deep model.
PROCESS_COUNTS = {"smdgp": (1, 0), "mmdgp": (1, 1), "idgp": (0, 1)}


@dataclass
class MultitaskOptions:
    """How a multitask model is built (see the module docstring for the defaults).

    Args:
        likelihood, likelihood_options: the likelihood family (one for all tasks, parameters
            per task) and its options or initial parameter values (e.g. ``{"variance": 0.01}``).
        inner_width: W, the width of the latent space λ^t.
        num_shared, shared_width: I shared processes g_i of D^{G_i} outputs each.
        num_private, private_width: J private processes h_j^t per task of D^{H_j} outputs.
        num_coregional: Q latent GPs mixed into cMDGP's latent space.
        coregional_rank: R latent GPs mixed into every output of a coregionalised GP.
        coregionalisation: ``"icm"`` (the mixed latent GPs share one kernel) or ``"lmc"``.
        num_inducing: M per task.
        num_samples: S, samples of the latent space per ELBO evaluation.
        batch_size: rows per minibatch (None: all); ``minibatch`` ``"stacked"`` or
            ``"stratified"`` (then ⌈batch_size/T⌉ rows from every task).
        q_scale: initial q_sqrt of the inner layers (relative to I).
        inner_noise: white-noise variance added to the inner marginals when sampling
            (DS-DGP's jitter; keeps ∂√v finite).
        inner_mean: ``"linear"`` (fixed identity/PCA mean) or ``"zero"``.
        inner_ard: ARD lengthscales in the inner layer.
        shared_*, private_*, top_*: initial Matérn-5/2 lengthscale and variance.
        learn_inducing: optimise the inducing inputs; ``jitter``: relative jitter on K_zz.
    """

    likelihood: str = "gaussian"
    likelihood_options: dict = field(default_factory=dict)
    inner_width: int | None = None
    num_shared: int | None = None
    shared_width: int | None = None
    num_private: int | None = None
    private_width: int | None = None
    num_coregional: int | None = None
    coregional_rank: int | None = None
    coregionalisation: str = "icm"
    num_inducing: int = 20
    num_samples: int = 1
    batch_size: int | None = None
    minibatch: str = "stacked"
    q_scale: float = 1e-5
    inner_noise: float = 1e-6
    inner_mean: str = "linear"
    inner_ard: bool = False
    shared_lengthscale: float = 1.0
    shared_variance: float = 1.0
    private_lengthscale: float = 1.0
    private_variance: float = 0.5
    top_lengthscale: float = 1.0
    top_variance: float = 1.0
    learn_inducing: bool = True
    jitter: float = DEFAULT_JITTER

    def __post_init__(self):
        for name, value, allowed in (("minibatch", self.minibatch, MINIBATCHES),
                                     ("inner_mean", self.inner_mean, INNER_MEANS),
                                     ("coregionalisation", self.coregionalisation,
                                      COREGIONALISATIONS)):
            if value not in allowed:
                raise ValueError(f"unknown {name} '{value}'; choose from {allowed}")
        if self.num_samples < 1 or self.num_inducing < 1:
            raise ValueError("num_samples and num_inducing must be at least 1")

    def resolved(self, kind: str, num_tasks: int, input_dim: int) -> MultitaskOptions:
        """Every default filled in for model ``kind`` with T tasks and D_in inputs; raises if
        the counts contradict the kind (sMDGP has no private, iDGP no shared processes)."""
        inner = self.inner_width or min(max(input_dim, 2), 10)
        shared, private = PROCESS_COUNTS.get(kind, (0, 0))
        shared = shared if self.num_shared is None else self.num_shared
        private = private if self.num_private is None else self.num_private
        if kind in PROCESS_COUNTS and (
                (kind == "smdgp" and (private or not shared))
                or (kind == "idgp" and (shared or not private)) or shared + private == 0):
            raise ValueError(f"{kind} cannot have {shared} shared and {private} private "
                             "processes")
        split = kind == "mmdgp" and shared and private
        shared_width = self.shared_width or (math.ceil(inner / 2) if split else inner)
        private_width = self.private_width or (max(inner - shared_width, 1) if split else inner)
        return replace(self, inner_width=inner, num_shared=shared, shared_width=shared_width,
                       num_private=private, private_width=private_width,
                       num_coregional=self.num_coregional or inner,
                       coregional_rank=self.coregional_rank or min(num_tasks, 2))
