"""Modules from independent fits in one coordinate system, exactly.

Each module keeps the standardisation of the data it was fitted on: inputs x̃ = (x − μ_x)/s_x and,
for location–scale likelihoods, targets ỹ = (y − μ_y)/s_y. Modules fitted at different sites
therefore live in different model units, and a meta-GP, an expert combination or a routed set
first converts every module to one coordinate system t. The conversion is exact — the converted
module predicts the same in data units — because every piece of a sparse GP maps affinely:

- inputs: x̃_t = (x̃ s_x + μ_x − μ_x,t)/s_x,t, so Z_t = (Z s_x + μ_x − μ_x,t)/s_x,t, and the kernel
  follows (:meth:`~pyrogp_models.kernels.base.Kernel.converted`: distances scale per dimension
  by r_d = s_x,d/s_x,t,d, so lengthscales and periods become ℓ_d r_d — an isotropic kernel
  becomes ARD where the r_d differ — and a linear kernel's centre moves like Z);
- outputs: f̃_t = a f̃ + b with a = s_y/s_y,t and b = (μ_y − μ_y,t)/s_y,t, so the prior becomes
  GP(b, a²k) — a constant prior mean b that the contrastive terms of the meta-GP carry — and
  q(u) = N(a m + b, a² S), the kernel a²k, the Gaussian noise a²σ²; for the
  heteroscedastic likelihood the second latent (the log noise variance) shifts by 2 log a;
- the ELBO, a log density of the targets, changes by −N log a.

The common system of a set of modules is the pooled standardisation of their data
(:func:`common_standardisation`): the N_k-weighted mean and the pooled variance of each module's
(μ, s), which is exactly the standardisation of the union of the data the modules saw when each
module's statistics are those of its own site (and the shared one for the modules of one fit).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace

import numpy as np
import torch

from pyrogp_models.data import Standardisation
from pyrogp_models.kernels import Kernel, describable
from pyrogp_models.likelihoods import LIKELIHOODS
from pyrogp_models.modules.record import Module

#: Standardisations closer than this (relative) count as the same: no conversion.
SAME_RTOL = 1e-12


def standardises_targets(module: Module) -> bool:
    """Whether the module's likelihood is location–scale, so its targets were standardised."""
    return LIKELIHOODS[module.likelihood_name].standardise_targets


def common_standardisation(modules: Mapping[str, Module]) -> Standardisation:
    """The pooled standardisation of the modules' data (module docstring); the modules' own
    when they all share one. Output statistics pool the modules that standardise targets."""
    members = list(modules.values())
    if all(_same(m.standardisation, members[0].standardisation) for m in members):
        return members[0].standardisation
    x_mean, x_scale = _pooled([(m.num_data, m.standardisation.x_mean, m.standardisation.x_scale)
                               for m in members])
    outputs = [(m.num_data, np.array([m.standardisation.y_mean]),
                np.array([m.standardisation.y_scale])) for m in members
               if standardises_targets(m)]
    if not outputs:
        return Standardisation(x_mean, x_scale, 0.0, 1.0)
    y_mean, y_scale = _pooled(outputs)
    return Standardisation(x_mean, x_scale, float(y_mean[0]), float(y_scale[0]))


def _pooled(stats: list[tuple[int, np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """Pooled mean and standard deviation of groups of N_k points with means μ_k, sds s_k."""
    counts = np.array([max(count, 1) for count, _, _ in stats], dtype=np.float64)[:, None]
    means = np.stack([mean for _, mean, _ in stats])
    scales = np.stack([scale for _, _, scale in stats])
    mean = (counts * means).sum(0) / counts.sum()
    variance = (counts * (scales**2 + (means - mean) ** 2)).sum(0) / counts.sum()
    return mean, np.where(variance > 0, np.sqrt(variance), 1.0)


def _same(a: Standardisation, b: Standardisation) -> bool:
    first = np.concatenate([a.x_mean, a.x_scale, [a.y_mean, a.y_scale]])
    second = np.concatenate([b.x_mean, b.x_scale, [b.y_mean, b.y_scale]])
    return first.shape == second.shape and bool(np.allclose(first, second, rtol=SAME_RTOL,
                                                            atol=0.0))


def convert(module: Module, target: Standardisation) -> Module:
    """The module in the model units of ``target`` (module docstring); the module itself when
    its standardisation already is ``target``. The output statistics of ``target`` apply only
    to a module whose likelihood standardises targets (others keep y_mean 0, y_scale 1)."""
    source = module.standardisation
    outputs = standardises_targets(module)
    if not outputs:
        target = Standardisation(target.x_mean, target.x_scale, 0.0, 1.0)
    if _same(source, target):
        return module
    like = module.inducing

    def tensor(values) -> torch.Tensor:
        return torch.as_tensor(np.asarray(values, dtype=np.float64), dtype=like.dtype,
                               device=like.device)

    inducing = (module.inducing * tensor(source.x_scale) + tensor(source.x_mean)
                - tensor(target.x_mean)) / tensor(target.x_scale)
    scale = source.y_scale / target.y_scale if outputs else 1.0  # a
    shift = (source.y_mean - target.y_mean) / target.y_scale if outputs else 0.0  # b
    # f (latent 0) maps to a f + b; the heteroscedastic log noise variance shifts by 2 log a
    a = torch.ones_like(module.prior_mean)
    b = torch.zeros_like(module.prior_mean)
    a[0], b[0] = scale, shift
    if module.likelihood_name == "heteroscedastic":
        b[1] = 2.0 * math.log(scale)
    kernel = module.kernel.converted(tensor(target.x_scale / source.x_scale),
                                     tensor((target.x_mean - source.x_mean) / source.x_scale), a)
    params = {key: value * scale**2 if key == "variance" else value
              for key, value in module.likelihood_params.items()}
    return replace(
        module, kernel=kernel.requires_grad_(False), likelihood_params=params,
        inducing=inducing, q_mean=a.unsqueeze(-1) * module.q_mean + b.unsqueeze(-1),
        q_chol=a[:, None, None] * module.q_chol, prior_mean=a * module.prior_mean + b,
        elbo=module.elbo - module.num_data * math.log(scale),
        standardisation=Standardisation(np.asarray(target.x_mean, dtype=np.float64),
                                        np.asarray(target.x_scale, dtype=np.float64),
                                        float(target.y_mean), float(target.y_scale)))


def convert_all(modules: Mapping[str, Module], target: Standardisation | None = None
                ) -> tuple[dict[str, Module], Standardisation]:
    """Every module in one system: ``target``, by default :func:`common_standardisation`."""
    target = common_standardisation(modules) if target is None else target
    return {name: convert(module, target) for name, module in modules.items()}, target


def kernel_in_model_units(kernel: Kernel, standardisation: Standardisation,
                          standardise_targets: bool = True) -> Kernel:
    """A kernel whose values are in data units, for the model units of ``standardisation``
    (x̃ = (x − μ_x)/s_x and, when targets are standardised, ỹ = (y − μ_y)/s_y); a kernel from
    outside the library is taken as it is (it sees model units)."""
    if not describable(kernel):
        return kernel
    reference = next(iter(kernel.named_values().values()))

    def tensor(values) -> torch.Tensor:
        return torch.as_tensor(np.asarray(values, dtype=np.float64), dtype=reference.dtype,
                               device=reference.device)

    output_scale = 1.0 / standardisation.y_scale if standardise_targets else 1.0
    return kernel.converted(tensor(standardisation.x_scale), tensor(standardisation.x_mean),
                            output_scale)
