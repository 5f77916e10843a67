"""A multitask GP as one batched Pyro model: inner layer (or none), top layer, per-task likelihood.

The ELBO (Boustati et al., eq. 9)

    L = Σ_t Σ_n E_{q(f_n^t)}[log p(y_n^t | f_n^t)] − Σ_t KL[q(F̃^t) ‖ p(F̃^t)]
        − Σ_t Σ_j KL[q(H̃_j^t) ‖ p(H̃_j^t)] − Σ_i KL[q(G̃_i) ‖ p(G̃_i)]

is estimated doubly stochastically (Salimbeni & Deisenroth 2017): S draws of the latent space at
every point of a minibatch from the inner marginals, λ = transform(μ + √(σ² + σ_w²) ε) with
ε ~ N(0, I) (reparameterised, :mod:`.processes`); for each draw the top layer's marginal
N(μ_f, σ_f²) at λ (eq. 21) and the likelihood's expectation E[log p(y | f)] — closed form
(Gaussian), Gauss–Hermite (Bernoulli), Monte Carlo (softmax) or deterministic quadrature
(robust-max) — averaged over the S draws and scaled per minibatch row
(:mod:`~pyrogp_models.models.multitask.data`); the KL terms are analytic and unscaled. With
noise correlated across the outputs at one input (cGP) the data term is the per-site Gaussian
on whitened rows (:mod:`~pyrogp_models.models.multitask.noise_correlation`).
Without an inner layer (iGP, cGP) λ = x and the data term is exact. All tasks' processes are
evaluated as batches over a [T, P] per-task layout: no N×N or cross-task matrix and no loop over
tasks.

As a Pyro model, every layer's whitened inducing values v are latent sites with an N(0, I) prior
and the guide is q(v), so ``TraceMeanField_ELBO`` evaluates the KLs analytically; the data term
enters as one ``pyro.factor`` computed from q's parameters. The data are bound as non-persistent
buffers, so ``model()`` and ``guide()`` take no arguments. The estimator's randomness (minibatch
rows, ε, softmax draws) comes from torch's global generator: ``pyro.set_rng_seed`` fixes it, and
:meth:`MultitaskGP.elbo` takes fixed per-row draws for common random numbers.

:meth:`MultitaskGP.to_state` gives a JSON-able config and the tensors, from which
:meth:`MultitaskGP.from_state` rebuilds the model (data may be bound again).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import asdict, replace
from typing import ClassVar

import pyro
import pyro.distributions as dist
import torch
from pyro.nn import PyroModule, pyro_method

from pyrogp_models.gaussian.collapsed_bound import (
    StructuredFeatures,
    collapsed_bound,
    structured_collapsed_bound,
)
from pyrogp_models.layers import ClosedFormGradients, SparseGPLayer, unique_name
from pyrogp_models.likelihoods import make_likelihood
from pyrogp_models.models.multitask.data import (
    DistinctInputs,
    TaskBatch,
    TaskData,
    TaskLayout,
    full_batch,
    stacked_batch,
    stratified_batch,
)
from pyrogp_models.models.multitask.initialisation import Initialisation
from pyrogp_models.models.multitask.noise_correlation import (
    SiteCorrelated,
    SiteLayout,
    SiteNoise,
    require_distinct_outputs,
)
from pyrogp_models.models.multitask.options import MultitaskOptions
from pyrogp_models.models.multitask.outputs import CoregionalisedGP, TaskGPs
from pyrogp_models.models.multitask.processes import LatentSpace
from pyrogp_models.models.multitask.task_likelihood import TaskSelected

#: Smallest variance a latent draw is scaled by (keeps ∂√v finite without inner white noise).
_MIN_VARIANCE = 1e-30


class MultitaskGP(PyroModule):
    """Base of the multitask models; a subclass names its ``kind`` and builds its layers. The
    objective is the ELBO of Boustati et al. (eq. 9), estimated doubly stochastically with
    ``options.num_samples`` draws of the latent space per row.

    Args:
        options: the architecture (resolved here for the subclass, T and D_in).
        init: initial inducing inputs, linear means and mixing (:class:`Initialisation`).
        data: the training data in model units (bound as non-persistent buffers), or None.
        name: the Pyro name (default: a fresh one from ``kind``).
    """

    kind: ClassVar[str]
    #: A single-layer model's GPs on x: "task" (Z^t per task) or "shared" (one Z for all
    #: tasks); None for a deep model, whose top-layer inputs move.
    inducing_on_inputs: ClassVar[str | None] = None
    #: Model classes by kind, filled in as subclasses are defined.
    registry: ClassVar[dict[str, type[MultitaskGP]]] = {}

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        MultitaskGP.registry[cls.kind] = cls

    def __init__(self, options: MultitaskOptions, init: Initialisation,
                 data: TaskData | None = None, name: str | None = None):
        super().__init__(name or unique_name(self.kind))
        self.num_tasks, self.input_dim = init.num_tasks, init.input_dim
        if options.num_inducing is None:
            options = replace(options, num_inducing=init.inducing.shape[-2])
        options = options.resolved(self.kind, self.num_tasks, self.input_dim)
        if options.learn_inducing is None:
            options = replace(options, learn_inducing=not self.exact_at(init, data))
        self.options = options
        dtype, device = init.inducing.dtype, init.inducing.device
        self.likelihood = make_likelihood(self.options.likelihood, (self.num_tasks,), dtype,
                                          device, **self.options.likelihood_options)
        self.latent, self.top = self.build_layers(self.options, init)
        self.site_noise = (SiteNoise(self.num_tasks, dtype, device)
                           if self.options.noise == "correlated" else None)
        self.collapsed = False  # see collapsed_objective()
        self.bind(data)

    @classmethod
    def exact_at(cls, init: Initialisation, data: TaskData | None) -> bool:
        """Whether the model is the exact GP on ``data`` from ``init``: a single-layer model
        whose inducing inputs are every input its GPs see (:meth:`Initialisation.covers`)."""
        if cls.inducing_on_inputs is None or data is None:
            return False
        return init.covers(data, per_task=cls.inducing_on_inputs == "task")

    def bind(self, data: TaskData | None) -> None:
        """Bind training data (model units) as non-persistent buffers ``data_X``, ``data_task``,
        ``data_y``, their per-task layout (``data_index``, ``data_mask``, ``data_slot``), for a
        model with shared processes (:attr:`shares_processes`) where tasks share inputs the
        layout's distinct inputs (``data_distinct_X``, ``data_distinct_index``:
        :meth:`distinct_inputs`) and, with correlated noise, their sites (``data_site_*``)."""
        values = {}
        if data is not None:
            if data.num_tasks != self.num_tasks:
                raise ValueError(f"the data have {data.num_tasks} tasks, the model "
                                 f"{self.num_tasks}")
            self.likelihood.validate_targets(data.y)
            layout = TaskLayout.of(data.task, self.num_tasks)
            values = {"X": data.X, "task": data.task, "y": data.y, "index": layout.index,
                      "mask": layout.mask, "slot": layout.slot}
            distinct = (DistinctInputs.of(data.X[layout.index]) if self.shares_processes
                        else None)
            if distinct is not None:
                values.update(distinct_X=distinct.X, distinct_index=distinct.index)
            if self.site_noise is not None:
                sites = SiteLayout.of(data.X, data.task, self.num_tasks)
                require_distinct_outputs(sites, data.y)
                values.update(site_rows=sites.rows, site_mask=sites.mask, site=sites.site)
        for key in ("X", "task", "y", "index", "mask", "slot", "distinct_X", "distinct_index",
                    "site_rows", "site_mask", "site"):
            self.register_buffer(f"data_{key}", values.get(key), persistent=False)

    def build_layers(self, options: MultitaskOptions, init: Initialisation
                     ) -> tuple[LatentSpace | None, TaskGPs | CoregionalisedGP]:
        """The inner layer (None for a single-layer model) and the top layer."""
        raise NotImplementedError

    # Shapes -------------------------------------------------------------------------------------
    @property
    def num_latent(self) -> int:
        """L, the latent functions per task (C for C classes)."""
        return self.likelihood.num_latent

    @property
    def is_deep(self) -> bool:
        """Whether an inner layer feeds the top layer (the DGPs; not iGP and cGP)."""
        return self.latent is not None

    @property
    def shares_processes(self) -> bool:
        """Whether some process sees the inputs themselves and is shared by the tasks (a deep
        model's shared inner processes, cGP's latent GPs): evaluated once per distinct input
        on the full batch."""
        return self.is_deep or isinstance(self.top, CoregionalisedGP)

    @property
    def noisy_objective(self) -> bool:
        """Whether the ELBO is estimated (inner-layer draws, minibatches or Monte Carlo
        expectations): the trainer then judges convergence against the loss's own noise."""
        return (self.is_deep or self.options.batch_size is not None
                or self.likelihood.stochastic)

    def variational_sites(self) -> list[tuple[str, SparseGPLayer]]:
        """(site name, layer) of every layer's whitened inducing values, inner layers first."""
        inner = [] if self.latent is None else [(name, block.layer)
                                                for name, block in self.latent.blocks()]
        return [*inner, ("top", self.top.layer)]

    def ard_weights(self) -> torch.Tensor:
        """ω = 1/ℓ² of the top layer's ARD kernels (eq. 10): [T, D^λ] for per-task top GPs,
        [1 or R, D^λ] (the latent GPs') for a coregionalised top."""
        return self.top.ard_weights()

    # The estimator ------------------------------------------------------------------------------
    def kl(self) -> torch.Tensor:
        """Σ of every KL term of eq. (9)."""
        inner = 0.0 if self.latent is None else self.latent.kl()
        return inner + self.top.kl()

    def draw_noise(self, num_samples: int, shape: tuple[int, int], like: torch.Tensor,
                   generator: torch.Generator | None = None, tie_shared: bool = False
                   ) -> torch.Tensor | None:
        """ε [S, T, P, noise_width] for one evaluation of the latent space on a [T, P] layout
        (None without an inner layer); ``tie_shared`` uses one draw of every shared process per
        slot for all tasks (for all tasks predicted at common inputs)."""
        if self.latent is None:
            return None
        width = self.latent.noise_width
        noise = torch.randn(num_samples, *shape, width, generator=generator, dtype=like.dtype,
                            device=like.device)
        if tie_shared:
            shared = self.latent.shared_width
            noise[..., :shared] = noise[:, :1, :, :shared].clone()
        return noise

    def latent_draws(self, X: torch.Tensor, noise: torch.Tensor | None,
                     distinct: DistinctInputs | None = None) -> torch.Tensor:
        """λ [S, T, P, D^λ] at X [T', P, D] (with its ``distinct`` inputs) from standard normal
        draws [S, T, P, noise_width] (x itself, [1, T', P, D], without an inner layer)."""
        if self.latent is None:
            return X.unsqueeze(0)
        mean, var = self.latent.marginals(X, distinct)
        return self.latent.transform(mean + self.inner_scale(var) * noise, X)

    def distinct_inputs(self, batch: TaskBatch) -> DistinctInputs | None:
        """The distinct inputs of ``batch``'s slots when it is every bound row and the tasks
        share inputs (None otherwise)."""
        if not batch.full or self.data_distinct_X is None:
            return None
        return DistinctInputs(self.data_distinct_X, self.data_distinct_index)

    def inner_scale(self, var: torch.Tensor) -> torch.Tensor:
        """√(σ² + σ_w²): the standard deviation of a draw of the inner blocks' outputs."""
        return (var + self.options.inner_noise).clamp_min(_MIN_VARIANCE).sqrt()

    def output_moments(self, X: torch.Tensor, noise: torch.Tensor | None,
                       distinct: DistinctInputs | None = None
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """λ and, per draw of it, the top layer's marginals N(μ_f, σ_f²) at the slots of the
        per-task layout X [T', P, D] (with its ``distinct`` inputs): λ [S, T, P, D^λ], μ_f and
        σ_f² [S, T, P(, L)]."""
        latent = self.latent_draws(X, noise, distinct)
        return (latent, *self.top.marginals(latent))

    def data_terms(self, batch: TaskBatch | None = None, noise: torch.Tensor | None = None
                   ) -> torch.Tensor:
        """The scaled data term of eq. (9) per task [T]: Σ_n w_n (1/S) Σ_s E[log p(y_n | f)]
        on ``batch`` (default: all rows, weight 1). ``noise``: fixed standard normal draws per
        data row [S, N, noise_width] (default: fresh draws, S = ``options.num_samples``).
        With correlated noise: :meth:`site_data_terms` (all rows, no draws)."""
        if self.site_noise is not None:  # a single layer on all rows (options.resolved)
            return self.site_data_terms()
        batch = self.full_batch() if batch is None else batch
        X, y = self.data_X[batch.rows], self.data_y[batch.rows]
        noise = (self.draw_noise(self.options.num_samples, batch.rows.shape, X)
                 if noise is None else noise[:, batch.rows])
        _, mean, var = self.output_moments(X, noise, self.distinct_inputs(batch))
        expected = self.likelihood.expected_log_prob(y, mean, var).mean(0)
        return (expected * batch.weights).sum(-1)

    # Noise correlated across a site's outputs ---------------------------------------------------
    def noise_covariance(self) -> torch.Tensor:
        """Σ = D^½ C D^½ [T, T] of the outputs at one site, C = I with independent noise
        (Gaussian likelihood)."""
        scale = self.likelihood.variance.sqrt()
        if self.site_noise is None:
            return torch.diag_embed(scale.square())
        return scale.unsqueeze(-1) * self.site_noise.correlation() * scale

    def data_sites(self) -> SiteLayout:
        """The sites of the bound rows (correlated noise only)."""
        self.data_layout()  # raises without bound data
        return SiteLayout(self.data_site_rows, self.data_site_mask, self.data_site,
                          self.data_task)

    def whitened_rows(self) -> tuple[StructuredFeatures, torch.Tensor, torch.Tensor,
                                     torch.Tensor, torch.Tensor]:
        """The bound rows as the whitened rows of the per-site likelihood
        (:mod:`~pyrogp_models.models.multitask.noise_correlation`), one per (site, task) [G·T]
        (site-major): features b̃ = (W̃_tr a_r)_r with W̃ = L_s⁻¹D^-½W (:class:`StructuredFeatures`
        at the distinct inputs, :meth:`coregional_projections`), residuals r̃ = L_s⁻¹D^-½(y),
        the unexplained variance ũ = Σ_r d_r(x_s) W̃_tr², the weights (1 where observed) and
        log σ_t + log (L_s)_tt. A whitened row's marginal is N(b̃ᵀm, b̃ᵀSb̃ + ũ) with unit
        noise."""
        sites, layout = self.data_sites(), self.data_layout()
        projections, prior, inputs = self.coregional_projections()
        inputs = sites.gather(layout.to_long(inputs.reshape(layout.index.shape)))
        factors = self.site_noise.site_factors(sites.mask)
        scale = self.likelihood.variance.sqrt()
        mixing = self.site_noise.whiten(factors, scale,
                                        sites.mask.unsqueeze(-1) * self.top.mixing)
        features = StructuredFeatures(projections, inputs.flatten(), mixing.flatten(0, 1))
        return (features,
                self.site_noise.whiten(factors, scale, sites.gather(self.data_y)).flatten(),
                features.mixed_variances(prior),
                sites.mask.flatten().to(mixing.dtype),
                self.site_noise.log_scales(factors, scale, sites.mask).flatten())

    def coregional_projections(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The latent GPs' projections a_r [R, M, U] and unexplained prior variances d_r
        [R, U] at the bound slots' U distinct inputs (every slot's own input where the tasks
        share none), and every slot's input among them [T·P]."""
        batch = self.full_batch()
        distinct = self.distinct_inputs(batch)
        if distinct is None:
            X = self.data_X[batch.rows].flatten(0, 1)
            inputs = torch.arange(len(X), device=X.device)
        else:
            X, inputs = distinct.X, distinct.index.flatten()
        projections, prior = self.top.projections(X)
        return projections.squeeze(-3), prior.squeeze(-2), inputs

    def site_data_terms(self) -> torch.Tensor:
        """The data term of eq. (9) with correlated noise, per task [T]: Σ over the task's
        whitened rows of E_q[log N(r̃ | f̃, 1)] − log σ_t − log (L_s)_tt."""
        features, residuals, unexplained, weights, log_scales = self.whitened_rows()
        features = features.dense()
        q = self.top.layer
        mean = features @ q.q_mean.reshape(-1)
        var = (features @ q.q_sqrt).square().sum(-1) + unexplained
        terms = -0.5 * ((residuals - mean).square() + var + math.log(2 * math.pi)) - log_scales
        return (weights * terms).reshape(-1, self.num_tasks).sum(0)

    def elbo(self, batch: TaskBatch | None = None, noise: torch.Tensor | None = None
             ) -> torch.Tensor:
        """The estimate of eq. (9) on ``batch`` (see :meth:`data_terms`)."""
        return self.data_terms(batch, noise).sum() - self.kl()

    def data_layout(self) -> TaskLayout:
        """The per-task layout of all bound rows."""
        if self.data_X is None:
            raise ValueError(f"this {self.kind} has no data bound")
        return TaskLayout(self.data_index, self.data_mask, self.data_task, self.data_slot)

    def full_batch(self) -> TaskBatch:
        """All bound rows, weight 1."""
        return full_batch(self.data_layout(), self.data_X.dtype)

    def draw_batch(self) -> TaskBatch:
        """A minibatch as ``options`` say (all rows without a batch size)."""
        size = self.options.batch_size
        if size is None:
            return self.full_batch()
        if self.options.minibatch == "stacked":
            return stacked_batch(self.data_task, size, self.num_tasks, self.data_X.dtype)
        return stratified_batch(self.data_layout(), -(-size // self.num_tasks),
                                self.data_X.dtype)

    # The collapsed bound ----------------------------------------------------------------------
    @property
    def collapsible(self) -> bool:
        """Whether the ELBO has a closed-form optimum in the top layer's q(v): a single-layer
        model with a Gaussian likelihood (a q per task, or one joint q for a coregionalised GP)
        on all rows."""
        return (not self.is_deep and self.likelihood.name == "gaussian"
                and self.options.batch_size is None
                and (isinstance(self.top, TaskGPs) or self.top.layer.covariance == "joint"))

    @property
    def independent_tasks(self) -> bool:
        """Whether the collapsed bound is a sum of independent per-task problems: a GP per task
        (iGP) with its own noise, every parameter with a leading task dimension."""
        return (self.collapsible and isinstance(self.top, TaskGPs) and self.site_noise is None
                and all(parameter.shape[:1] == (self.num_tasks,)
                        for parameter in self.parameters()))

    def collapsed_bound(self, per_task: bool = False) -> torch.Tensor:
        """Titsias' bound on all rows: the ELBO (eq. 9) at the top layer's optimal q(v) for the
        current hyperparameters: for a GP per task one bound per task
        (:func:`~pyrogp_models.gaussian.collapsed_bound.collapsed_bound` of its features), for a
        coregionalised GP one from its latent GPs' projections at the distinct inputs
        (:func:`~pyrogp_models.gaussian.collapsed_bound.structured_collapsed_bound`);
        ``per_task``: the bound of every task [T] of an iGP (:attr:`independent_tasks`) instead
        of their sum."""
        if not self.collapsible:
            raise ValueError(f"this {self.kind} has no collapsed bound (it needs a single "
                             "layer, a Gaussian likelihood and all rows)")
        if per_task and not self.independent_tasks:
            raise ValueError(f"the collapsed bound of this {self.kind} does not split by task")
        if self.site_noise is not None:
            features, residuals, unexplained, weights, log_scales = self.whitened_rows()
            return (structured_collapsed_bound(features, residuals, weights,
                                               torch.ones_like(weights), unexplained)
                    - log_scales.sum())
        batch = self.full_batch()
        y = self.data_y[batch.rows]
        if isinstance(self.top, CoregionalisedGP):  # one joint q: every row of every task
            projections, prior, inputs = self.coregional_projections()
            mixing = self.top.mixing.unsqueeze(1).expand(*y.shape, -1)           # [T, P, R]
            features = StructuredFeatures(projections, inputs, mixing.flatten(0, 1))
            return structured_collapsed_bound(
                features, y.flatten(), batch.weights.flatten(),
                self.likelihood.variance.unsqueeze(-1).expand_as(y).flatten(),
                features.mixed_variances(prior))
        features, offset, unexplained = self.top.features(self.data_X[batch.rows].unsqueeze(0))
        bounds = collapsed_bound(features.squeeze(0), (y - offset).reshape(y.shape),
                                 batch.weights,
                                 self.likelihood.variance.unsqueeze(-1).expand_as(y),
                                 unexplained.reshape(y.shape))
        return bounds if per_task else bounds.sum()

    def member_objectives(self, precise: bool = False) -> list | None:
        """Within :meth:`collapsed_objective`, an iGP's (parameters, −bound [T]): its tasks are
        independent problems, so the batched L-BFGS keeps one memory and one step length per
        task (:class:`~pyrogp_models.inference.protocols.IndependentMembers`; the bound is
        always evaluated precisely). None for any other model or objective: its tasks share
        parameters."""
        if not (self.collapsed and self.independent_tasks):
            return None
        parameters = [parameter for parameter in self.parameters() if parameter.requires_grad]
        return [(parameters, lambda: -self.collapsed_bound(per_task=True))]

    def held_parameters(self) -> list[torch.nn.Parameter]:
        """The top layer's inducing inputs, which the batched L-BFGS may hold late in a fit
        (:class:`~pyrogp_models.inference.protocols.HeldParameters`)."""
        return self.top.layer.inducing_parameters()

    @contextmanager
    def collapsed_objective(self):
        """Within: the Pyro model is the collapsed bound (its only factor), the guide is empty
        and the top layer's q(v) is no training parameter (``requires_grad`` off), so that an
        optimiser of the hyperparameters sees q(v) at its optimum throughout. q(v) itself is
        left as it was: a unit natural-gradient step puts it at the optimum."""
        if not self.collapsible:
            self.collapsed_bound()  # raises, naming why
        parameters = self.top.layer.variational_parameters()
        learned = [parameter.requires_grad for parameter in parameters]
        self.collapsed = True
        for parameter in parameters:
            parameter.requires_grad_(False)
        try:
            yield self
        finally:
            self.collapsed = False
            for parameter, flag in zip(parameters, learned, strict=True):
                parameter.requires_grad_(flag)

    # Pyro model / guide -----------------------------------------------------------------------
    @pyro_method
    def model(self):
        """Whitened priors v ~ N(0, I) of every layer; the scaled data term as a factor (within
        :meth:`collapsed_objective`: Titsias' bound as the only factor)."""
        if self.collapsed:
            pyro.factor(self._pyro_get_fullname("collapsed"), self.collapsed_bound())
            return
        for name, layer in self.variational_sites():
            layer.sample(self._pyro_get_fullname(name), posterior=False)
        pyro.factor(self._pyro_get_fullname("data"), self.data_terms(self.draw_batch()).sum())

    @pyro_method
    def guide(self, *args, **kwargs):
        """q(v) of every layer (nothing within :meth:`collapsed_objective`). Arguments of the
        model are accepted and ignored."""
        if self.collapsed:
            return
        for name, layer in self.variational_sites():
            layer.sample(self._pyro_get_fullname(name), posterior=True)

    @pyro_method
    def predictive_model(self, X: torch.Tensor | None = None, tasks: torch.Tensor | None = None):
        """Draws through the layers at rows (X [N, D], tasks [N]) in model units (default: the
        bound data): sites ``<layer>`` (whitened inducing values), ``hidden`` [N, W] (the inner
        blocks' outputs: λ itself, or cMDGP's u), ``f`` [N(, L)] and ``y`` [N]. With
        :meth:`predictive_guide`, ``pyro.infer.Predictive`` draws the posterior predictive."""
        if X is None:
            self.data_layout()  # raises without bound data
            X, tasks = self.data_X, self.data_task
        return self.predictive_sites(X, tasks, self._pyro_get_fullname)

    @pyro_method
    def predictive_guide(self, *args, **kwargs):
        """q(v) for :meth:`predictive_model`."""
        self.guide()

    def predictive_sites(self, X: torch.Tensor, tasks: torch.Tensor,
                         site: Callable[[str], str]) -> torch.Tensor:
        """The sites of :meth:`predictive_model`, named by ``site``; returns y."""
        layout = TaskLayout.of(tasks, self.num_tasks)
        X_layout = layout.gather(X, 1)
        whitened = {name: layer.sample(site(name), posterior=False)
                    for name, layer in self.variational_sites()}
        latent = X_layout
        if self.latent is not None:
            mean, var = self.latent.conditional(whitened, X_layout)
            scale = self.inner_scale(var).expand_as(mean)
            outputs = pyro.sample(site("hidden"), dist.Normal(
                layout.to_long(mean, 1), layout.to_long(scale, 1)).to_event(2))
            latent = self.latent.transform(layout.gather(outputs, 1), X_layout)
        mean, var = self.top.conditional(whitened["top"], latent)
        event = 1 if self.num_latent == 1 else 2
        mean, var = layout.to_long(mean, event - 1), layout.to_long(var, event - 1)
        f = pyro.sample(site("f"), dist.Normal(mean, var.sqrt().expand_as(mean)).to_event(event))
        return pyro.sample(site("y"), self.observation(f, X, tasks).to_event(1))

    def observation(self, f: torch.Tensor, X: torch.Tensor, tasks: torch.Tensor
                    ) -> TaskSelected | SiteCorrelated:
        """p(y_n | f_n) with task t_n's likelihood parameters, for rows (X [N, D], tasks [N])
        f [..., N(, L)]; with correlated noise, correlated across the rows of every site."""
        if self.site_noise is None:
            return TaskSelected(self.likelihood, f, tasks)
        sites = SiteLayout.of(X, tasks, self.num_tasks)
        return SiteCorrelated(f, self.likelihood.variance.sqrt(),
                              self.site_noise.site_factors(sites.mask), sites)

    # Natural gradients ------------------------------------------------------------------------
    def top_data_gradients(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(∂E/∂m, ∂E/∂S) of the data term E of eq. (9) on a batch (:meth:`draw_batch`, fresh
        draws of λ) with respect to the top layer's whitened q(v) = N(m, S), in closed form for a
        Gaussian likelihood: E is quadratic in the marginal means and linear in their variances,
        so the gradients are sums over the rows (the top layer's ``data_gradients``) of
        ∂E/∂μ_n = w_n(y_n − μ_n)/σ_t² and ∂E/∂σ_n² = −w_n/(2σ_t²), no backward pass through the
        layers."""
        if self.site_noise is not None:  # whitened rows: unit noise
            with torch.no_grad():
                features, residuals, _, weights, _ = self.whitened_rows()
                errors = residuals - features.times(self.top.layer.q_mean.reshape(-1))
                return features.transpose_times(weights * errors), -0.5 * features.gram(weights)
        batch = self.draw_batch()
        X, y = self.data_X[batch.rows], self.data_y[batch.rows]
        noise = self.draw_noise(self.options.num_samples, batch.rows.shape, X)

        def derivatives(mean: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            with torch.enable_grad():
                mean = mean.detach().requires_grad_()
                var = torch.zeros_like(mean, requires_grad=True)
                data = (self.likelihood.expected_log_prob(y, mean, var).mean(0)
                        * batch.weights).sum()
                return torch.autograd.grad(data, (mean, var))

        with torch.no_grad():
            return self.top.data_gradients(
                self.latent_draws(X, noise, self.distinct_inputs(batch)), derivatives)

    def natural_gradient_objectives(self) -> list:
        """With a Gaussian likelihood and a GP per task (or a joint q) on top, the top layer:
        given the draws
        of λ the ELBO is a concave quadratic in its q(u) (a unit step is that draw's optimum);
        the inner layers are left to the optimiser (objective ``"optimiser"``, the natural-
        gradient hook's ``OPTIMISER``); the top layer's gradients are given in closed form
        (:meth:`top_data_gradients`). Raises ``ValueError`` otherwise."""
        conjugate_top = (isinstance(self.top, TaskGPs)
                         or self.top.layer.covariance == "joint")
        if self.likelihood.name != "gaussian" or not conjugate_top:
            raise ValueError(f"natural gradients of a deep GP ({self.kind}) need a Gaussian "
                             "likelihood and a top layer conjugate in its q(u); train with "
                             "natural_gradient_lr=None")
        inner = [(block.layer, "optimiser") for _, block in self.latent.blocks()]
        return [*inner, (self.top.layer, ClosedFormGradients(self.top_data_gradients))]

    # State --------------------------------------------------------------------------------------
    def to_state(self) -> tuple[dict, dict[str, torch.Tensor]]:
        """A JSON-able config and the tensors (parameters, unconstrained, and the fixed means):
        all a file needs to rebuild the model (no data)."""
        config = {"model": self.kind, "num_tasks": self.num_tasks, "input_dim": self.input_dim,
                  "options": asdict(self.options)}
        return config, {key: value.detach().clone() for key, value in self.state_dict().items()}

    @classmethod
    def from_state(cls, config: dict, tensors: dict[str, torch.Tensor],
                   data: TaskData | None = None, name: str | None = None) -> MultitaskGP:
        """The model :meth:`to_state` described (optionally with data bound)."""
        model_class = MultitaskGP.registry[config["model"]]
        options = MultitaskOptions(**{"noise": "independent", **config["options"]})
        reference = next(iter(tensors.values()))
        init = Initialisation.blank(config["num_tasks"], options.num_inducing,
                                    config["input_dim"], reference.dtype, reference.device)
        model = model_class(options, init, data, name)
        model.load_state_dict(tensors)
        return model

