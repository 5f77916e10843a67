"""The architecture of a multitask (deep) GP: widths, process counts, inducing points, the
estimator's sample size and initial hyperparameters — a JSON-able record (``dataclasses.asdict``)
from which a model and its saved tensors rebuild it.

Defaults (Boustati et al., Sec. 4.1 and App. B, with the changes that make the models train to
their best):

- one shared process of width W_s and, for mMDGP, one private process per task of width W_p; the
  width W defaults to D_in clipped to [2, 10], and W_s = W_p = W, so that every process's fixed
  linear mean passes all inputs through (identity, zero-padded) whenever D_in ≤ 10;
- M inducing points per process: a private process and every task's top GP have M, and so has a
  shared (or coregionalised) process — the same budget in every model, a cost linear in the
  number of tasks. M defaults to the rows of the largest task, at most
  :data:`MAX_DEFAULT_TASK_INDUCING` (resolved from the data by ``build_model``); a single-layer
  model whose inducing inputs are then every input is the exact GP, and they stay fixed;
- S = 1 sample in training; the inner q(u) starts at its prior (q_sqrt = I, whitened: KL = 0) and
  the inner kernels with a small variance, so that at the start the inner layer passes its
  inputs through almost unchanged and the model is its shallow counterpart;
- Matérn-5/2 everywhere (:mod:`.kernel`); ARD in the top layer; every lengthscale starts at √
  the dimension the process sees (:func:`.kernel.initial_lengthscale`); private kernels start
  with another variance than the shared ones (symmetry breaking, Sec. 2.2);
- with a Gaussian likelihood the per-task top GPs of the deep models have a learned linear mean
  on the latent space (``top_mean="linear"``, starting at 0): the linear coregionalisation of
  the shared processes (eq. 11) sits inside the non-linear model. With any other likelihood the
  mean is zero, the paper's: a learned linear mean of logits is a logistic regression without
  a prior, whose weights grow without bound where the classes are linearly separable
  (scikit-learn's wine: ELBO → 0 and a held-out log loss of 0.64 against 0.11);
- the coregionalised models (cGP, cMDGP) mix R = min(T, 2) latent GPs per output (the rank of
  the coregionalisation matrix) and cMDGP mixes Q = W latent GPs into its latent space;
- cGP with a Gaussian likelihood on all rows has noise correlated across the outputs observed at
  one input (``noise="correlated"``, starting independent); every other model independent noise.

A default cGP fit also tries R = T and independent noise and keeps the candidate that predicts
held-out stretches best (:func:`pyrogp_models.inference.multitask_fit.default_candidates`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from pyrogp_models.gaussian.linalg import DEFAULT_JITTER
from pyrogp_models.models.multitask.data import MINIBATCHES

INNER_MEANS = ("linear", "zero")
TOP_MEANS = ("linear", "zero")
#: Models whose top layer is a GP per task on a latent space (they take the linear top mean).
TASK_TOPS_ON_LATENTS = ("smdgp", "mmdgp", "idgp")
COREGIONALISATIONS = ("icm", "lmc")
#: The noise across the outputs observed at one input (:mod:`.noise_correlation`).
NOISES = ("independent", "correlated")
#: The most inducing inputs per process by default: every row of the largest task up to this
#: (where a single-layer model has them all, it is the exact GP and they stay fixed).
MAX_DEFAULT_TASK_INDUCING = 400
#: Latent GPs a coregionalised model mixes by default (at most the number of tasks).
DEFAULT_COREGIONAL_RANK = 2
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
        num_inducing: M per process (None: from the data, see the module docstring).
        num_samples: S, samples of the latent space per ELBO evaluation.
        batch_size: rows per minibatch (None: all); ``minibatch`` ``"stacked"`` or
            ``"stratified"`` (then ⌈batch_size/T⌉ rows from every task).
        q_scale: initial q_sqrt of the inner layers (relative to I; 1 is the prior).
        noise: ``"correlated"`` (cGP only: a learned correlation of the noise across the
            outputs observed at one input) or ``"independent"`` (None: see the module
            docstring).
        inner_noise: white-noise variance added to the inner marginals when sampling
            (DS-DGP's jitter; keeps ∂√v finite).
        inner_mean: ``"linear"`` (fixed identity/PCA mean) or ``"zero"``.
        inner_ard: ARD lengthscales in the inner layer.
        top_mean: ``"linear"`` (a learned m^t(λ) = λ b^t) or ``"zero"`` for the per-task top
            GPs (None: linear for sMDGP, mMDGP and iDGP with a Gaussian likelihood, else
            zero).
        shared_*, private_*, top_*: initial Matérn-5/2 lengthscale and variance (lengthscale
            None: √ of the dimension the process sees, :func:`.kernel.initial_lengthscale`).
        learn_inducing: optimise the inducing inputs (None: unless a single-layer model's
            inducing inputs are every input it sees, where it is the exact GP:
            :meth:`.MultitaskGP.exact_at`); ``jitter``: relative jitter on K_zz.
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
    coregionalisation: str = "lmc"
    num_inducing: int | None = None
    num_samples: int = 1
    batch_size: int | None = None
    minibatch: str = "stacked"
    q_scale: float = 1.0
    noise: str | None = None
    inner_noise: float = 1e-10
    inner_mean: str = "linear"
    inner_ard: bool = False
    top_mean: str | None = None
    shared_lengthscale: float | None = None
    shared_variance: float = 0.01
    private_lengthscale: float | None = None
    private_variance: float = 0.005
    top_lengthscale: float | None = None
    top_variance: float = 1.0
    learn_inducing: bool | None = None
    jitter: float = DEFAULT_JITTER

    def __post_init__(self):
        for name, value, allowed in (("minibatch", self.minibatch, MINIBATCHES),
                                     ("inner_mean", self.inner_mean, INNER_MEANS),
                                     ("top_mean", self.top_mean or "zero", TOP_MEANS),
                                     ("coregionalisation", self.coregionalisation,
                                      COREGIONALISATIONS),
                                     ("noise", self.noise or "independent", NOISES)):
            if value not in allowed:
                raise ValueError(f"unknown {name} '{value}'; choose from {allowed}")
        if self.num_samples < 1 or (self.num_inducing is not None and self.num_inducing < 1):
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
        top_mean = self.top_mean or ("linear" if kind in TASK_TOPS_ON_LATENTS
                                     and self.likelihood == "gaussian" else "zero")
        if top_mean == "linear" and kind in ("cgp", "cmdgp"):
            raise ValueError(f"{kind}'s coregionalised top layer has no linear mean; use "
                             "top_mean='zero'")
        correlated_noise_fits = self.correlated_noise_fits(kind)
        noise = self.noise or ("correlated" if correlated_noise_fits else "independent")
        if noise == "correlated" and not correlated_noise_fits:
            raise ValueError("correlated noise needs cgp with a Gaussian likelihood on all rows "
                             f"(got {kind}, {self.likelihood}, batch size {self.batch_size})")
        return replace(self, inner_width=inner, noise=noise, num_shared=shared,
                       shared_width=self.shared_width or inner, num_private=private,
                       private_width=self.private_width or inner,
                       num_coregional=self.num_coregional or inner,
                       coregional_rank=(self.coregional_rank
                                        or min(num_tasks, DEFAULT_COREGIONAL_RANK)),
                       top_mean=top_mean)

    def correlated_noise_fits(self, kind: str) -> bool:
        """Whether model ``kind`` can have noise correlated across the outputs at one input:
        cGP with a Gaussian likelihood on all rows."""
        return kind == "cgp" and self.likelihood == "gaussian" and self.batch_size is None

    def with_inducing_for(self, counts: list[int]) -> MultitaskOptions:
        """``num_inducing`` resolved for tasks of ``counts`` rows: the rows of the largest
        task, at most :data:`MAX_DEFAULT_TASK_INDUCING` (unchanged when given)."""
        if self.num_inducing is not None:
            return self
        return replace(self, num_inducing=max(1, min(max(counts), MAX_DEFAULT_TASK_INDUCING)))
