"""Likelihoods with exact (or quadrature) variational expectations and predictive densities."""

from pyrogp_models.likelihoods.base import Likelihood, latent_layout
from pyrogp_models.likelihoods.bernoulli import Bernoulli
from pyrogp_models.likelihoods.categorical import Categorical
from pyrogp_models.likelihoods.gaussian import Gaussian
from pyrogp_models.likelihoods.heteroscedastic import HeteroscedasticGaussian
from pyrogp_models.likelihoods.poisson import Poisson

#: Likelihood classes by the name used in module files and on the command line.
LIKELIHOODS: dict[str, type[Likelihood]] = {
    cls.name: cls for cls in (Gaussian, Bernoulli, Poisson, Categorical, HeteroscedasticGaussian)
}


def make_likelihood(name: str, batch_shape=(), dtype=None, device=None, **kwargs) -> Likelihood:
    """Build a likelihood by name (``gaussian``, ``bernoulli``, ``poisson``, ``categorical``,
    ``heteroscedastic``); ``kwargs`` are options (link, num_classes, ...) or parameter values."""
    if name not in LIKELIHOODS:
        raise ValueError(f"unknown likelihood '{name}'; choose from {sorted(LIKELIHOODS)}")
    return LIKELIHOODS[name](batch_shape, dtype, device, **kwargs)


def monte_carlo_expectation(name: str, options: dict) -> bool:
    """Whether likelihood ``name`` with ``options`` estimates its expected log-likelihood by
    Monte Carlo (a softmax), not in closed form or by quadrature: such an objective has no
    exact value to judge a natural-gradient step or an L-BFGS line search by."""
    return make_likelihood(name, (), **options).stochastic


__all__ = ["LIKELIHOODS", "Bernoulli", "Categorical", "Gaussian", "HeteroscedasticGaussian",
           "Likelihood", "Poisson", "latent_layout", "make_likelihood",
           "monte_carlo_expectation"]
