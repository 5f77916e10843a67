"""Predictions in data units: the one base every predictive model of the library shares.

A model computes its latent predictive q(f*) in model units — standardised inputs and, for
location–scale likelihoods, standardised targets. :class:`Predictor` maps inputs in data units
to model units, applies the model's likelihood to the latent moments and maps results back:

- ``predict_f(X)``: latent mean and variance [N] (or [N, L]), in model units;
- ``predict_y(X)``: mean and variance of y in data units (class probabilities and p(1 − p) for
  classifiers);
- ``log_predictive(X, y)``: log p(y_i | x_i) per point in data units (− log of the output scale
  for standardised targets);
- ``to_inference_data(X, y)``: an ArviZ ``InferenceData`` (a ``DataTree`` on ArviZ ≥ 1) with
  posterior draws of the latent function at X, posterior-predictive draws of y, the pointwise
  log-likelihood log p(y_i | f_i) at the *sampled* f (so PSIS-LOO and LOO-PIT carry posterior
  uncertainty) and the observed data; one chain.

The draws come from ``pyro.infer.Predictive`` on :meth:`Predictor.predictive_model` and
:meth:`Predictor.predictive_guide`. The default model draws f_i ~ N(m_i, v_i) independently from
the latent marginals; a module draws through its inducing variables (:class:`~pyrogp_models.
modules.record.Module`). ``labels`` name the partition of each point for modules partitioned by a
label column (:class:`~pyrogp_models.modules.routing.RoutedModules`); others ignore them.

A subclass provides ``standardisation``, ``input_dim``, ``dtype``, ``device``,
:meth:`Predictor.likelihood` and :meth:`Predictor.latent`, and may set ``columns`` (the names
of the data columns, :class:`~pyrogp_models.data.columns.Columns`) and free-form ``info``.
"""

from __future__ import annotations

import math

import numpy as np
import pyro
import pyro.distributions as dist
import torch
from pyro.infer import Predictive

from pyrogp_models.arviz_bridge import to_inference_data
from pyrogp_models.data import Standardisation
from pyrogp_models.data.columns import Columns
from pyrogp_models.errors import DataError
from pyrogp_models.likelihoods import Likelihood


class Predictor:
    """Data-units predictions from a latent predictive in model units (module docstring):
    inputs X [N, D] in data units; ``predict_f`` and ``predict_y`` return two [N] (or [N, L])
    tensors, ``log_predictive`` one [N]."""

    standardisation: Standardisation
    #: The data columns the predictor was fitted on (feature names, target name, units).
    columns: Columns = Columns()
    info: dict

    # What a subclass provides -------------------------------------------------------------------
    def likelihood(self) -> Likelihood:
        """The observation model, unbatched, with frozen parameters."""
        raise NotImplementedError

    def latent(self, X: torch.Tensor, labels=None) -> tuple[torch.Tensor, torch.Tensor]:
        """Latent mean and variance [N] or [N, L] in model units at inputs X [N, D] given in
        data units (a tensor of the predictor's dtype and device)."""
        raise NotImplementedError

    # Shared -------------------------------------------------------------------------------------
    @property
    def is_classifier(self) -> bool:
        return self.likelihood().is_classifier

    def inputs(self, X) -> torch.Tensor:
        """Inputs [N, D] (data units) as a tensor of the predictor's dtype and device."""
        X = torch.as_tensor(X, dtype=self.dtype, device=self.device)
        if X.dim() != 2 or X.shape[-1] != self.input_dim:
            raise DataError(f"expected inputs of shape [N, {self.input_dim}], got "
                            f"{tuple(X.shape)}")
        return X

    def model_targets(self, y) -> torch.Tensor:
        """Validated targets in model units (standardised for location–scale likelihoods)."""
        likelihood = self.likelihood()
        y = torch.as_tensor(y, dtype=self.dtype, device=self.device)
        likelihood.validate_targets(y)
        return self.standardisation.transform_y(y) if likelihood.standardise_targets else y

    def log_output_scale(self) -> float:
        """log of the output scale that densities of standardised targets are divided by."""
        if not self.likelihood().standardise_targets:
            return 0.0
        return math.log(self.standardisation.y_scale)

    def predict_f(self, X, labels=None) -> tuple[torch.Tensor, torch.Tensor]:
        """Latent mean and variance at X [N, D] (data units): [N] or [N, L], model units."""
        with torch.no_grad():
            return self.latent(self.inputs(X), labels)

    def predict_y(self, X, labels=None) -> tuple[torch.Tensor, torch.Tensor]:
        """Predictive mean and variance of y in data units."""
        return self.y_moments(*self.predict_f(X, labels))

    def log_predictive(self, X, y, labels=None) -> torch.Tensor:
        """log p(y_i | x_i) per point [N], in data units."""
        return self.y_log_density(y, *self.predict_f(X, labels))

    def y_moments(self, mean: torch.Tensor, var: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor]:
        """The likelihood applied to latent moments (model units): y's mean and variance in data
        units."""
        likelihood = self.likelihood()
        y_mean, y_var = likelihood.predictive_moments(mean, var)
        if likelihood.standardise_targets:
            return (self.standardisation.inverse_y_mean(y_mean),
                    self.standardisation.inverse_y_var(y_var))
        return y_mean, y_var

    def y_log_density(self, y, mean: torch.Tensor, var: torch.Tensor) -> torch.Tensor:
        """log p(y_i) [N] in data units under latent moments in model units."""
        targets = self.model_targets(y)
        return self.likelihood().log_predictive(targets, mean, var) - self.log_output_scale()

    # Pyro -------------------------------------------------------------------------------------
    def predictive_model(self, X: torch.Tensor, labels=None):
        """f_i ~ N(m_i, v_i) independently at X [N, D] (data units) and y_i | f_i: sample sites
        ``f`` [N(, L)] and ``y`` [N], in model units."""
        mean, var = self.latent(X, labels)
        f = pyro.sample("f", dist.Normal(mean, var.sqrt()).to_event(mean.dim()))
        return pyro.sample("y", self.likelihood().distribution(f).to_event(1))

    def predictive_guide(self, X: torch.Tensor, labels=None):
        """The variational posterior of the latent sites of :meth:`predictive_model` that are
        not drawn there (none by default)."""

    def posterior_draws(self, X, num_samples: int = 500, labels=None, seed: int = 0
                        ) -> dict[str, torch.Tensor]:
        """``pyro.infer.Predictive`` draws of every site at X [N, D] (data units), model units:
        ``f`` [S, N(, L)], ``y`` [S, N] and the model's other latent sites."""
        pyro.set_rng_seed(seed)
        with torch.no_grad():
            return Predictive(self.predictive_model, guide=self.predictive_guide,
                              num_samples=num_samples, parallel=True)(self.inputs(X), labels)

    def pointwise_draws(self, X, y, num_samples: int = 500, labels=None, seed: int = 0
                        ) -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:
        """Posterior draws at the observed (X, y) in data units: the latent sites (``f`` [S, N]
        or [S, N, L] and the model's others), posterior-predictive ``y`` [S, N] and the
        pointwise log-likelihood log p(y_i | f_i) [S, N]."""
        likelihood = self.likelihood()
        targets = self.model_targets(y)
        draws = {name.rsplit(".", 1)[-1]: value
                 for name, value in self.posterior_draws(X, num_samples, labels, seed).items()}
        f, y_draws = draws.pop("f"), draws.pop("y")
        with torch.no_grad():
            log_lik = likelihood.distribution(f).log_prob(targets) - self.log_output_scale()
        if likelihood.standardise_targets:
            y_draws = self.standardisation.inverse_y_mean(y_draws)
            if f.dim() == 2:
                f = self.standardisation.inverse_y_mean(f)
        return {**draws, "f": f}, y_draws, log_lik

    def to_inference_data(self, X, y, labels=None, num_samples: int = 500, seed: int = 0):
        """ArviZ container of posterior draws at the observed (X, y), data units (module
        docstring): groups posterior (``f`` and the model's other latent sites),
        posterior_predictive (``y``), log_likelihood (``y``) and observed_data (``y``)."""
        posterior, y_draws, log_lik = self.pointwise_draws(X, y, num_samples, labels, seed)
        point_dims = ["point"] if posterior["f"].dim() == 2 else ["point", "latent"]
        return to_inference_data(
            posterior=posterior, posterior_predictive={"y": y_draws},
            log_likelihood={"y": log_lik},
            observed_data={"y": np.asarray(torch.as_tensor(y).cpu(), dtype=np.float64)},
            dims={"f": point_dims, "y": ["point"]})
