"""Gauss–Hermite quadrature for expectations under univariate Gaussians.

E_{N(f|m,v)}[g(f)] ≈ π^{-1/2} Σ_s w_s g(m + √(2v) x_s), with (x_s, w_s) the nodes and weights of
the degree-S Hermite polynomial (numpy ``hermgauss``); S = 20 throughout the library.
Gauss–Legendre nodes on [−1, 1] serve integrals split into pieces (the robust-max link).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import lru_cache

import numpy as np
import torch

NUM_NODES = 20


@lru_cache(maxsize=8)
def _hermgauss(num_nodes: int) -> tuple[np.ndarray, np.ndarray]:
    return np.polynomial.hermite.hermgauss(num_nodes)


@lru_cache(maxsize=8)
def _leggauss(num_nodes: int) -> tuple[np.ndarray, np.ndarray]:
    return np.polynomial.legendre.leggauss(num_nodes)


def legendre_nodes_and_weights(like: torch.Tensor, num_nodes: int
                               ) -> tuple[torch.Tensor, torch.Tensor]:
    """Gauss–Legendre nodes and weights on [−1, 1] (numpy ``leggauss``), on the dtype and device
    of ``like``: ∫_{−1}^{1} g(u) du ≈ Σ_q w_q g(u_q)."""
    u, w = _leggauss(num_nodes)
    return (torch.as_tensor(u, dtype=like.dtype, device=like.device),
            torch.as_tensor(w, dtype=like.dtype, device=like.device))


def nodes_and_log_weights(like: torch.Tensor, num_nodes: int = NUM_NODES
                          ) -> tuple[torch.Tensor, torch.Tensor]:
    """Standard-normal nodes √2·x_s and log(w_s/√π), on the dtype and device of ``like``."""
    x, w = _hermgauss(num_nodes)
    nodes = torch.as_tensor(x * math.sqrt(2.0), dtype=like.dtype, device=like.device)
    log_weights = torch.as_tensor(np.log(w) - 0.5 * math.log(math.pi), dtype=like.dtype,
                                  device=like.device)
    return nodes, log_weights


def gaussian_points(mean: torch.Tensor, var: torch.Tensor, num_nodes: int = NUM_NODES
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """Quadrature points f_s = m + √v·√2 x_s of shape [..., S] and their log weights [S]."""
    nodes, log_weights = nodes_and_log_weights(mean, num_nodes)
    points = mean.unsqueeze(-1) + var.clamp_min(0.0).sqrt().unsqueeze(-1) * nodes
    return points, log_weights


def expectation(fn: Callable[[torch.Tensor], torch.Tensor], mean: torch.Tensor,
                var: torch.Tensor, num_nodes: int = NUM_NODES) -> torch.Tensor:
    """E_{N(m,v)}[fn(f)], with ``fn`` applied elementwise to points of shape [..., S]."""
    points, log_weights = gaussian_points(mean, var, num_nodes)
    return (fn(points) * log_weights.exp()).sum(-1)


def log_expectation(log_fn: Callable[[torch.Tensor], torch.Tensor], mean: torch.Tensor,
                    var: torch.Tensor, num_nodes: int = NUM_NODES) -> torch.Tensor:
    """log E_{N(m,v)}[exp(log_fn(f))], summed in log space (for predictive densities)."""
    points, log_weights = gaussian_points(mean, var, num_nodes)
    return torch.logsumexp(log_fn(points) + log_weights, dim=-1)
