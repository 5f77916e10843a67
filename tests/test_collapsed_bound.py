"""Titsias' collapsed bound from structured features (a coregionalised GP's rows, computed at the
distinct inputs) against the same bound from the dense feature matrix, and a coregionalised GP
with every input inducing against the exact GP's log marginal likelihood."""

import pytest
import torch

from pyrogp_models.gaussian.collapsed_bound import (
    StructuredFeatures,
    collapsed_bound,
    structured_collapsed_bound,
)
from pyrogp_models.models.multitask import MultitaskOptions, TaskData, build_model


def structured_problem(seed: int) -> dict[str, torch.Tensor]:
    """R = 3 latent GPs' projections at U = 7 distinct inputs (M = 4), 20 rows that repeat
    inputs, five of them padding (weight 0), with their own noise."""
    generator = torch.Generator().manual_seed(seed)

    def draw(*shape):
        return torch.randn(*shape, generator=generator, dtype=torch.float64)
    weights = torch.ones(20, dtype=torch.float64)
    weights[torch.randperm(20, generator=generator)[:5]] = 0.0
    return {"projections": draw(3, 4, 7), "inputs": torch.randint(7, (20,), generator=generator),
            "coefficients": draw(20, 3), "residuals": draw(20), "weights": weights,
            "noise": draw(20).exp(), "unexplained": draw(20).square()}


def dense_features(projections, inputs, coefficients):
    """φ_n = (c_nr a_r(x_{u_n}))_r [N, R·M], built row by row."""
    return torch.stack([torch.cat([c[r] * projections[r, :, u] for r in range(len(c))])
                        for u, c in zip(inputs.tolist(), coefficients, strict=True)])


@pytest.mark.parametrize("seed", [0, 1])
def test_the_structured_bound_is_the_bound_of_the_dense_features(seed):
    problem = structured_problem(seed)
    leaves = [problem[key].requires_grad_() for key in
              ("projections", "coefficients", "residuals", "noise", "unexplained")]
    features = StructuredFeatures(problem["projections"], problem["inputs"],
                                  problem["coefficients"])
    structured = structured_collapsed_bound(features, problem["residuals"], problem["weights"],
                                            problem["noise"], problem["unexplained"])
    dense = collapsed_bound(dense_features(problem["projections"], problem["inputs"],
                                           problem["coefficients"]),
                            problem["residuals"], problem["weights"], problem["noise"],
                            problem["unexplained"])
    assert float(structured) == pytest.approx(float(dense), rel=1e-12)
    for ours, theirs in zip(torch.autograd.grad(structured, leaves),
                            torch.autograd.grad(dense, leaves), strict=True):
        torch.testing.assert_close(ours, theirs, rtol=1e-10, atol=1e-12)


@torch.no_grad()
@pytest.mark.parametrize("shared_inputs", [True, False])
def test_with_every_input_inducing_a_cgp_bound_is_the_exact_log_marginal_likelihood(
        shared_inputs):
    """Independent noise, three tasks (LMC, rank 2) at shared inputs (the distinct inputs'
    path) or at inputs of their own: Z = X makes the collapsed bound the exact GP's
    log p(y) = log N(y | 0, Σ_r W_r W_rᵀ ⊗ K_r + diag σ_t²)."""
    generator = torch.Generator().manual_seed(3)
    sites, tasks = 9, 3
    X = torch.linspace(-1, 1, sites, dtype=torch.float64)[:, None].repeat(tasks, 1)
    if not shared_inputs:
        X = X + 0.01 * torch.arange(tasks, dtype=torch.float64).repeat_interleave(sites)[:, None]
    task = torch.arange(tasks).repeat_interleave(sites)
    y = torch.randn(len(task), generator=generator, dtype=torch.float64)
    model = build_model("cgp", TaskData(X, task, y, tasks),
                        MultitaskOptions(jitter=1e-12, noise="independent",
                                         num_inducing=len(X) if not shared_inputs else sites))
    assert not model.options.learn_inducing                       # Z = X: the exact GP
    assert (model.data_distinct_X is not None) == shared_inputs
    model.top.mixing.copy_(torch.randn(tasks, 2, generator=generator, dtype=torch.float64))
    model.likelihood.variance = torch.tensor([0.3, 0.5, 0.2], dtype=torch.float64)
    mixing, kernel = model.top.mixing, model.top.layer.kernel
    latent = kernel(X[None, None].expand(2, 1, -1, -1), X[None, None].expand(2, 1, -1, -1))
    K = ((mixing[task][:, None] * mixing[task][None]) * latent[:, 0].permute(1, 2, 0)).sum(-1)
    K = K + torch.diag(model.likelihood.variance[task])
    exact = torch.distributions.MultivariateNormal(torch.zeros(len(y), dtype=y.dtype), K)
    assert float(model.collapsed_bound()) == pytest.approx(float(exact.log_prob(y)), abs=1e-7)
