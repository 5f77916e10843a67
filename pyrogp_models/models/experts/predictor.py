"""A dictionary of modules combined by a product-of-experts rule, as a predictor.

:class:`ExpertCombination` follows the library's predictor protocol
(:class:`pyrogp_models.modules.routing.Predictor`). Per test point it

1. predicts every expert's latent N(m_j, σ_j²) (batched, :class:`.ModuleExperts`),
2. combines them in f-space with :func:`.rules.combine` (Cohen et al., ICML 2020, §2.2–§4),
3. applies the experts' likelihood to the combined latent (§2.2, eq. 6): Gaussian noise is added
   *after* combining; class probabilities are the likelihood's E[p(y | f)] under the combined
   Gaussian (``Likelihood.predictive_moments`` / ``log_predictive``).

Choices, all documented on the class:

* prior: zero mean in model units and σ*² = the mean over experts of k_j(x*, x*) (with a shared
  kernel, as for exact experts trained by eq. 2, this is that kernel's k(x*, x*));
* noise and other likelihood parameters: the mean of the experts' values;
* grBCM: the communication expert is the module whose ``info["role"]`` is ``"communication"``
  (:func:`~pyrogp_models.models.experts.exact.grbcm_rows`; one must be), the others are the
  augmented experts +j, trained on its points and their own.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from pyrogp_models.modules.predictor import Predictor
from pyrogp_models.modules.record import Module

from .module_experts import ModuleExperts
from .rules import RULES, combine, combine_in_y_space
from .weights import WEIGHTINGS

__all__ = ["ExpertCombination", "SPACES"]

#: Where the experts are combined: their latent f (the paper's choice) or their noisy y.
SPACES = ("f", "y")

#: Test points per prediction chunk: [J, chunk] holds about this many expert moments.
_PREDICT_ENTRIES = 1 << 22
#: Test points per combination chunk: small enough for the rules' temporaries to stay in cache.
_COMBINE_ENTRIES = 1 << 16


class ExpertCombination(Predictor):
    """Modules combined by a product-of-experts rule (f-space by default), in data units.

    Args:
        modules: the experts by name (any modules: exact GP experts, SVGP experts, multi-class
            SVGP experts); they must share the likelihood, else
            :class:`~pyrogp_models.errors.IncompatibleModulesError`, and are converted to one
            standardisation (:mod:`pyrogp_models.modules.units`). A prebuilt
            :class:`.ModuleExperts` is reused as is (e.g. to compare rules without restacking).
        rule: one of :data:`.rules.RULES` — ``poe``, ``gpoe``, ``bcm``, ``rbcm``, ``grbcm``,
            ``barycenter`` (exact 1-D W2) or ``barycenter-paper`` (eq. 12).
        weights: ``None`` (the rule's own) or one of :data:`.weights.WEIGHTINGS` —
            ``uniform``, ``entropy``, ``softmax-var``, ``softmax-entropy``, ``softmax-w2``.
        temperature: T of the tempered softmax weightings, eq. (13).
        normalise: ``None`` keeps each weighting's convention (softmax and uniform weights are
            normalised, entropy weights are not); ``False`` with ``softmax-var`` gives the
            paper's rBCM_var_u. See :data:`.rules.PRESETS` for the paper's named models.
        space: ``"f"`` combines the latent experts, then applies the likelihood; ``"y"``
            (Gaussian likelihood only, for comparison, §2.2 and §6) combines the y-predictives
            N(m_j, σ_j² + σ²) against the prior σ*² + σ²; :meth:`predict_f` then returns the
            implied latent (m, σ_y² − σ²), whose variance is negative wherever the y-space rule
            is more confident than the noise.

    The prior is N(0, σ*²) in model units with σ*² the mean of the experts' k_j(x*, x*); the
    Gaussian noise (and any other likelihood parameter) is the mean of the experts' values. For
    ``grbcm`` the communication expert is the module with ``info["role"] == "communication"``
    (one must be: experts of an ordinary partition are not augmented by a communication set, and
    taking one of them for it would silently give another model) and the other modules are the
    augmented experts.
    """

    def __init__(self, modules: Mapping[str, Module] | ModuleExperts, rule: str,
                 weights: str | None = None, temperature: float | None = None, *,
                 normalise: bool | None = None, space: str = "f"):
        if rule not in RULES:
            raise ValueError(f"unknown combination rule {rule!r}; expected one of {RULES}")
        if weights is not None and weights not in WEIGHTINGS:
            raise ValueError(f"unknown weighting {weights!r}; expected one of {WEIGHTINGS}")
        if space not in SPACES:
            raise ValueError(f"unknown space {space!r}; expected one of {SPACES}")
        self.experts = modules if isinstance(modules, ModuleExperts) else ModuleExperts(modules)
        self.rule, self.weights, self.temperature = rule, weights, temperature
        self.normalise, self.space = normalise, space
        self._likelihood = self.experts.likelihood()
        first = self.experts.modules[0]
        self.likelihood_name = first.likelihood_name
        self.standardisation = self.experts.standardisation
        self.columns = first.columns
        self.info = {}
        self.communication = None
        if rule == "grbcm":
            if self.experts.num_experts < 2:
                raise ValueError("grbcm needs a communication expert and at least one more")
            roles = [m.info.get("role") for m in self.experts.modules]
            if "communication" not in roles:
                raise ValueError("grbcm needs a communication expert (a module whose info role "
                                 "is 'communication') and experts trained on its points and "
                                 "their own (grbcm_rows); these modules have none: choose "
                                 "another rule")
            self.communication = roles.index("communication")
            self._augmented = torch.as_tensor(
                [j for j in range(self.experts.num_experts) if j != self.communication])
        if space == "y" and self.likelihood_name != "gaussian":
            raise ValueError("y-space combination needs a Gaussian likelihood")
        # Fail now, not at the first prediction, on a bad rule/weights/temperature combination.
        latents = [self.experts.num_latent] if self.experts.num_latent > 1 else []
        ones = torch.ones(self.experts.num_experts, 1, *latents, dtype=self.experts.dtype)
        self._combine(ones, ones, ones[0])

    def likelihood(self):
        """The observation model applied after combining (parameters: the experts' mean)."""
        return self._likelihood

    @property
    def names(self) -> list[str]:
        return self.experts.names

    def combine_moments(self, mean: torch.Tensor, var: torch.Tensor, prior_var: torch.Tensor
                        ) -> tuple[torch.Tensor, torch.Tensor]:
        """Combined latent (mean, var) [N(, L)] from expert moments [J, N(, L)] and the prior
        variance [N(, L)], all in model units (e.g. to compare rules on one set of moments)."""
        chunk = max(1, _COMBINE_ENTRIES // mean.shape[0])
        parts = [self._combine(*chunks) for chunks in zip(
            mean.split(chunk, 1), var.split(chunk, 1), prior_var.split(chunk), strict=True)]
        return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])

    def _combine(self, mean: torch.Tensor, var: torch.Tensor, prior_var: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor]:
        communication = None
        if self.communication is not None:
            c = self.communication
            communication = (mean[c], var[c])
            mean, var = mean[self._augmented], var[self._augmented]
        kwargs = dict(prior_var=prior_var, prior_mean=self.experts.prior_mean(),
                      weights=self.weights, temperature=self.temperature,
                      normalise=self.normalise, communication=communication)
        if self.space == "f":
            return combine(self.rule, mean, var, **kwargs)
        noise = self._likelihood.variance
        y_mean, y_var = combine_in_y_space(self.rule, mean, var, noise_var=noise, **kwargs)
        return y_mean, y_var - noise

    @property
    def input_dim(self) -> int:
        return self.experts.input_dim

    @property
    def dtype(self) -> torch.dtype:
        return self.experts.dtype

    @property
    def device(self) -> torch.device:
        return self.experts.modules[0].device

    def expert_moments(self, X) -> tuple[torch.Tensor, torch.Tensor]:
        """Every expert's latent mean and variance at X (data units): [J, N(, L)], model units."""
        return self.experts.predict_f(X)

    def latent(self, X: torch.Tensor, labels=None) -> tuple[torch.Tensor, torch.Tensor]:
        """Combined latent mean and variance [N] (or [N, L]) in model units at X (data units);
        ``labels`` are ignored (every expert sees every point)."""
        chunk = max(1, _PREDICT_ENTRIES // self.experts.num_experts)
        parts = [self.combine_moments(*self.expert_moments(X_chunk),
                                      self.experts.prior_var(X_chunk))
                 for X_chunk in X.split(chunk)]
        return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
