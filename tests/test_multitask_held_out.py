"""The held-out error of single-layer multitask GPs (inference/multitask_held_out.py) and the
default cGP's choice of rank by it."""

from dataclasses import replace

import pytest
import torch
from pyrogp_models.inference.multitask_fit import (
    MultitaskSpec,
    fit_multitask_dgp,
    rank_candidates,
)
from pyrogp_models.inference.multitask_held_out import (
    held_out_error,
    held_out_task_errors,
    task_regions,
)
from pyrogp_models.inference.natural_gradient import NaturalGradient

from multitask_helpers import randomise, toy_data
from pyrogp_models.models.multitask import MultitaskOptions, TaskData, build_model, toy_tasks


def heterotopic_data() -> TaskData:
    """Three outputs of two latent functions at 14 inputs, the third missing at four."""
    generator = torch.Generator().manual_seed(3)
    x = torch.linspace(-1.5, 1.5, 14, dtype=torch.float64)[:, None]
    first, second = torch.sin(3 * x[:, 0]), torch.cos(2 * x[:, 0])
    outputs = [first, second, first - 0.5 * second]
    rows = [torch.arange(14), torch.arange(14), torch.arange(10)]
    X = torch.cat([x[index] for index in rows])
    task = torch.cat([torch.full((len(index),), t) for t, index in enumerate(rows)])
    y = torch.cat([output[index] for output, index in zip(outputs, rows, strict=True)])
    return TaskData.from_long(X, task, y + 0.1 * torch.randn(len(y), generator=generator,
                                                             dtype=y.dtype), 3)


def exact_covariance(model, X: torch.Tensor, task: torch.Tensor) -> torch.Tensor:
    """Cov(y) of an LMC cGP with noise correlated across the outputs at one input, written
    out: Σ_r W_{t r} W_{s r} k_r(x, x') + Σ_{t s} where x = x'."""
    with torch.no_grad():
        gram = model.top.layer.kernel(X[None, None], X[None, None])[:, 0]        # [R, N, N]
        mixing = model.top.mixing[task]                                          # [N, R]
        signal = torch.einsum("nr,mr,rnm->nm", mixing, mixing, gram)
        same_input = (X == X.mT).all(-1) if X.shape[-1] > 1 else X == X.mT
        noise = model.noise_covariance()[task][:, task] * same_input
    return signal + noise


@pytest.mark.parametrize("noise", ["correlated", "independent"])
def test_the_held_out_error_of_the_exact_gp_is_the_gaussian_conditional_of_every_region(noise):
    """With every input an inducing input, cGP is the exact GP: each region's prediction is
    E[y_H | y_rest] of the joint Gaussian at the fitted hyperparameters."""
    data = heterotopic_data()
    model = randomise(build_model("cgp", data, MultitaskOptions(jitter=1e-10, noise=noise)))
    if noise == "correlated":
        model.site_noise.correlation_raw.data = torch.tensor([0.6, -0.4, 0.3],
                                                             dtype=torch.float64)
    NaturalGradient(model, 1.0)(lambda: -model.elbo())
    covariance = exact_covariance(model, data.X, data.task)
    generator = torch.Generator().manual_seed(0)
    expected = []
    for task in range(3):
        rows = torch.nonzero(data.task == task).squeeze(-1)
        regions = task_regions(data.X[rows], 10, generator)
        squared = []
        for region in torch.unique(regions):
            hidden = rows[regions == region]
            rest = torch.ones(len(data.y), dtype=torch.bool)
            rest[hidden] = False
            mean = covariance[hidden][:, rest] @ torch.linalg.solve(
                covariance[rest][:, rest], data.y[rest])
            squared.append((mean - data.y[hidden]).square())
        expected.append(torch.cat(squared).mean())
    errors = held_out_task_errors(model, data, seed=0)
    torch.testing.assert_close(errors, torch.stack(expected), rtol=1e-7, atol=1e-10)
    assert held_out_error(model, data, seed=0) == pytest.approx(float(errors.mean()))


def test_the_held_out_error_leaves_the_model_as_it_was():
    data, _ = toy_data(15)
    model = randomise(build_model("cgp", data, MultitaskOptions(num_inducing=6)))
    state = {key: value.clone() for key, value in model.state_dict().items()}
    elbo = float(model.elbo())
    held_out_error(model, data)
    assert all(torch.equal(value, state[key]) for key, value in model.state_dict().items())
    assert float(model.elbo()) == elbo and torch.equal(model.data_X, data.X)


def test_a_model_without_a_closed_form_optimum_has_no_held_out_error():
    data, _ = toy_data(10)
    with pytest.raises(ValueError, match="single-layer"):
        held_out_error(build_model("smdgp", data, MultitaskOptions(num_inducing=4)), data)


def test_a_default_cgp_on_more_than_two_tasks_keeps_the_rank_that_predicts_hidden_regions_best():
    """Rank 2 and a latent GP per task (⌈2M/T⌉ fixed inducing inputs each) are both fitted;
    the fit is the one with the lower held-out error and records both fits' phases, ELBOs and
    held-out errors."""
    pairs = toy_tasks(20, seed=0)
    X, generator = pairs[0][0], torch.Generator().manual_seed(0)
    third = pairs[0][1] - pairs[1][1] + 0.3 * torch.randn(len(X), generator=generator).numpy()
    pairs = [*pairs, (X, third)]
    spec = MultitaskSpec(model="cgp", num_inducing=9)
    low, full = rank_candidates(spec, 3)
    assert (low.coregional_rank, low.num_inducing) == (2, 9)
    assert (full.coregional_rank, full.num_inducing, full.learn_inducing) == (3, 6, False)
    assert rank_candidates(MultitaskSpec(model="cgp", coregional_rank=2), 3)[0].coregional_rank == 2
    assert len(rank_candidates(spec, 2)) == len(rank_candidates(replace(spec, model="igp"), 3)) == 1
    fits = [fit_multitask_dgp(pairs, candidate) for candidate in (low, full)]
    errors = [held_out_error(each.model, each.data) for each in fits]
    assert errors[0] != errors[1]
    fit = fit_multitask_dgp(pairs, spec)
    best = fits[errors.index(min(errors))]
    assert fit.elbo == best.elbo and fit.model.options.coregional_rank == best.spec.coregional_rank
    assert [phase.elbo for phase in fit.phases] == [each.elbo for each in fits]
    assert [phase.held_out for phase in fit.phases] == errors
    assert [phase.model for phase in fit.phases] == ["cgp (R = 2)", "cgp (R = 3)"]
