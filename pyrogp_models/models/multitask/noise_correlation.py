"""Noise correlated across the outputs observed at one input: a Gaussian likelihood per site.

Outputs observed at the same input (a *site*: a row of a wide table) share what a smooth f
cannot explain — the day's weather, the sample's handling — so their noise is correlated:
y(x) = f(x) + ε(x), ε(x) ~ N(0, Σ) with Σ = D^½ C D^½, D the tasks' noise variances σ_t² (the
likelihood's) and C a correlation matrix, C = (1 − δ) L Lᵀ + δI with L lower-triangular with
unit-norm rows (L = rows of I + strictly-lower(raw) normalised; raw = 0 is C = I, independent
noise) and δ = :data:`MIN_UNSHARED` the least share of a site's noise an output keeps to itself
(outputs that are exact copies of each other would otherwise drive C singular). Noise at
different sites is independent.

At a site s with observed outputs o, with C_oo = L_s L_sᵀ and z = D^-½ (y − f),
z̃ = L_s⁻¹ z_o (whitening),

    log N(y_o | f_o, Σ_oo) = Σ_i [−½ z̃_i² − ½ log 2π − log σ_{t_i} − log (L_s)_ii],

one Gaussian term with unit noise per observed output (the chain rule over the site's outputs
in task order). Under q(f) the whitened rows keep this form: their features, residuals and
unexplained variances are the rows' own, whitened (:meth:`SiteNoise.whiten`). An unobserved
output's row and column are the identity's in the padded C (M C M + I − M, M = diag(observed)),
whose Cholesky keeps it apart. Repeated inputs of one task open further sites (the k-th row of
every task at x forms site (x, k)).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from pyro.distributions import TorchDistribution, constraints
from pyro.nn import PyroModule, PyroParam

from pyrogp_models.errors import DataError
from pyrogp_models.gaussian.linalg import cholesky

#: δ: every output keeps this share of its noise variance to itself (|correlation| ≤ 1 − δ).
MIN_UNSHARED = 1e-4


@dataclass(frozen=True)
class SiteLayout:
    """Rows grouped by site: ``rows`` [G, T] is the row of every (site, task) (0 where the
    output is not observed there) and ``mask`` [G, T] marks the observed ones; ``site`` and
    ``tasks`` [N] are every row's site and task."""

    rows: torch.Tensor
    mask: torch.Tensor
    site: torch.Tensor
    tasks: torch.Tensor

    @classmethod
    def of(cls, X: torch.Tensor, tasks: torch.Tensor, num_tasks: int) -> SiteLayout:
        """Sites of rows (X [N, D], tasks [N]): equal inputs, the k-th row of each task at x
        in site (x, k)."""
        _, place = torch.unique(X, dim=0, return_inverse=True)
        key = place * num_tasks + tasks
        order = torch.argsort(key, stable=True)
        _, counts = torch.unique_consecutive(key[order], return_counts=True)
        starts = torch.repeat_interleave(counts.cumsum(0) - counts, counts)
        repeat = torch.empty_like(tasks)
        repeat[order] = torch.arange(len(tasks), device=tasks.device) - starts
        _, site = torch.unique(place * (int(repeat.max()) + 1 if len(tasks) else 1) + repeat,
                               return_inverse=True)
        num_sites = int(site.max()) + 1 if len(tasks) else 0
        rows = tasks.new_zeros(num_sites, num_tasks)
        rows[site, tasks] = torch.arange(len(tasks), device=tasks.device)
        mask = torch.zeros(num_sites, num_tasks, dtype=torch.bool, device=tasks.device)
        mask[site, tasks] = True
        return cls(rows, mask, site, tasks)

    def gather(self, values: torch.Tensor) -> torch.Tensor:
        """Per-row values [N, *E] → per (site, task) [G, T, *E], 0 where not observed."""
        gathered = values[self.rows]
        mask = self.mask.reshape(*self.mask.shape, *([1] * (gathered.dim() - 2)))
        return gathered * mask


def require_distinct_outputs(sites: SiteLayout, y: torch.Tensor) -> None:
    """Raise :class:`DataError` if two tasks are exact linear copies of each other at the
    inputs where both are observed (at least three; |correlation| within 1e-9 of 1, or the
    dtype's rounding): their noise would be one noise, whose correlation has no optimum short
    of singular."""
    tolerance = max(1e-9, 1e3 * torch.finfo(y.dtype).eps)
    values = sites.gather(y)
    for first in range(values.shape[-1]):
        for second in range(first + 1, values.shape[-1]):
            both = sites.mask[:, first] & sites.mask[:, second]
            if int(both.sum()) < 3:
                continue
            pair = torch.stack([values[both, first], values[both, second]])
            centred = pair - pair.mean(-1, keepdim=True)
            scale = centred.norm(dim=-1)
            if bool((scale == 0).any()):
                continue  # a constant output is another check's concern
            if float(1 - (centred[0] @ centred[1] / scale.prod()).abs()) < tolerance:
                raise DataError(f"tasks {first} and {second} are exact linear copies of each "
                                f"other at the {int(both.sum())} inputs where both are "
                                "observed: their noises cannot be told apart; drop one of "
                                "them or make the noise independent")


class SiteNoise(PyroModule):
    """The correlation C of the noise across the T outputs at one site (see the module
    docstring); starts at C = I."""

    def __init__(self, num_tasks: int, dtype: torch.dtype = torch.float64,
                 device: torch.device | str | None = None):
        super().__init__()
        self.num_tasks = num_tasks
        count = num_tasks * (num_tasks - 1) // 2
        self.correlation_raw = PyroParam(torch.zeros(count, dtype=dtype, device=device))

    def factor(self) -> torch.Tensor:
        """L [T, T], lower-triangular with unit-norm rows: C = (1 − δ) L Lᵀ + δI."""
        raw = self.correlation_raw
        eye = torch.eye(self.num_tasks, dtype=raw.dtype, device=raw.device)
        lower = torch.tril_indices(self.num_tasks, self.num_tasks, -1, device=raw.device)
        factor = eye.index_put((lower[0], lower[1]), raw)
        return factor / factor.norm(dim=-1, keepdim=True)

    def correlation(self) -> torch.Tensor:
        """C = (1 − δ) L Lᵀ + δI [T, T]."""
        factor = self.factor()
        eye = torch.eye(self.num_tasks, dtype=factor.dtype, device=factor.device)
        return (1 - MIN_UNSHARED) * (factor @ factor.mT) + MIN_UNSHARED * eye

    def site_factors(self, mask: torch.Tensor) -> torch.Tensor:
        """chol(C_oo) of every site, padded [G, T, T] (``mask`` [G, T]: the observed o)."""
        observed = mask.to(self.correlation_raw.dtype)
        padded = (self.correlation() * observed.unsqueeze(-1) * observed.unsqueeze(-2)
                  + torch.diag_embed(1 - observed))
        return cholesky(padded, 0.0, what="noise correlation of the outputs at an input")

    def whiten(self, factors: torch.Tensor, scale: torch.Tensor, values: torch.Tensor
               ) -> torch.Tensor:
        """L_s⁻¹ D^-½ v for per-(site, task) values v [G, T, *E] (``scale`` = σ [T])."""
        flat = values.reshape(*values.shape[:2], -1) / scale.unsqueeze(-1)
        whitened = torch.linalg.solve_triangular(factors, flat, upper=False)
        return whitened.reshape(values.shape)

    def log_scales(self, factors: torch.Tensor, scale: torch.Tensor, mask: torch.Tensor
                   ) -> torch.Tensor:
        """log σ_t + log (L_s)_tt per (site, task) [G, T] (0 where not observed): with
        −½ z̃² − ½ log 2π, the log density of every whitened row."""
        return (scale.log() + factors.diagonal(dim1=-2, dim2=-1).log()) * mask


class SiteCorrelated(TorchDistribution):
    """p(y | f) of rows f [..., N] with noise σ_t [T] correlated across each site's outputs by
    the padded factors [G, T, T] (:meth:`SiteNoise.site_factors`) of ``sites``: batch [..., N];
    ``log_prob`` gives every row the term of its whitened row (they sum to the joint density)."""

    arg_constraints: dict = {}
    support = constraints.real

    def __init__(self, f: torch.Tensor, scale: torch.Tensor, factors: torch.Tensor,
                 sites: SiteLayout):
        self.f, self.scale, self.factors, self.sites = f, scale, factors, sites
        super().__init__(f.shape, validate_args=False)

    def expand(self, batch_shape, _instance=None):
        """The same observation with f broadcast to ``batch_shape`` (Pyro's plates expand)."""
        return SiteCorrelated(self.f.expand(batch_shape), self.scale, self.factors, self.sites)

    def sample(self, sample_shape=()):
        shape = torch.Size(sample_shape) + self.f.shape[:-1] + self.sites.mask.shape
        draws = torch.randn(shape, dtype=self.f.dtype, device=self.f.device)
        correlated = (self.factors @ draws.unsqueeze(-1)).squeeze(-1)
        rows = correlated[..., self.sites.site, self.sites.tasks]
        return self.f + self.scale[self.sites.tasks] * rows

    def log_prob(self, value):
        sites = self.sites
        standardised = (value - self.f) / self.scale[sites.tasks]
        by_site = standardised[..., sites.rows] * sites.mask
        whitened = torch.linalg.solve_triangular(self.factors, by_site.unsqueeze(-1),
                                                 upper=False).squeeze(-1)
        terms = (-0.5 * whitened.square() - 0.5 * math.log(2 * math.pi)
                 - self.factors.diagonal(dim1=-2, dim2=-1).log() - self.scale.log())
        return terms[..., sites.site, sites.tasks]


def condition_on_site(mean: torch.Tensor, cov: torch.Tensor, noise: torch.Tensor,
                      observed: torch.Tensor, values: torch.Tensor
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """The predictive of every output h at N sites given the site's other observed outputs o,
    whose information about f is already in q(f) = N(mean [N, T], cov [N, T, T]): with the noise
    covariance Σ [T, T] (or one per site [N, T, T]), y_h = f_h + g(y_o − f_o) + ε with
    g = Σ_ho Σ_oo⁻¹, so

        E = μ_h + g(y_o − μ_o),   V = cᵀ cov c + Σ_hh − g Σ_oh,   c = e_h − g,

    mean and variance [N, T] (``observed`` [N, T] marks the y_o in ``values`` [N, T]). For
    outputs not in the fit, pass cov = 0 and Σ = cov + Σ: y ~ N(μ, cov + Σ) conditioned."""
    num_tasks = mean.shape[-1]
    eye = torch.eye(num_tasks, dtype=mean.dtype, device=mean.device)
    others = observed.unsqueeze(-2) & ~eye.bool()                              # [N, h, T]
    weight = others.to(mean.dtype)
    padded = (noise.unsqueeze(-3) * weight.unsqueeze(-1) * weight.unsqueeze(-2)
              + torch.diag_embed(1 - weight))                                  # [N, h, T, T]
    gain = torch.linalg.solve(padded, (noise * weight).unsqueeze(-1)).squeeze(-1) * weight
    residuals = torch.where(observed, values - mean, torch.zeros_like(mean))
    combination = eye - gain                                                   # [N, h, T]
    var = (torch.einsum("nht,nts,nhs->nh", combination, cov.expand(len(mean), -1, -1),
                        combination)
           + noise.diagonal(dim1=-2, dim2=-1) - (gain * noise).sum(-1))
    return mean + (gain * residuals.unsqueeze(-2)).sum(-1), var
