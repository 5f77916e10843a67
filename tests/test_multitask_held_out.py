"""The held-out error of single-layer multitask GPs (inference/multitask_held_out.py) and the
default cGP's choice among its candidates by it."""

import re
import warnings
from dataclasses import replace

import numpy as np
import pytest
import torch
from pyrogp_models.inference import multitask_fit
from pyrogp_models.inference.multitask_fit import (
    MultitaskSpec,
    _fitted,
    _fold_fitter,
    _label,
    default_candidates,
    default_config,
    fit_multitask_dgp,
)
from pyrogp_models.inference.multitask_held_out import (
    HELD_OUT_FOLDS,
    fold_of_rows,
    gap_weights,
    held_out_error,
    held_out_predictions,
)
from pyrogp_models.inference.natural_gradient import NaturalGradient

from multitask_helpers import randomise, toy_data
from pyrogp_models.errors import CandidateDroppedWarning, CholeskyError, DataError
from pyrogp_models.models.multitask import (
    MultitaskOptions,
    TaskData,
    TaskStandardisation,
    build_model,
    toy_tasks,
)
from pyrogp_models.models.multitask.noise_correlation import SiteLayout, require_distinct_outputs


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


def test_every_task_and_region_is_hidden_once_with_other_outputs_kept_beside_it():
    data = heterotopic_data()
    folds = fold_of_rows(data, num_folds=5)
    assert bool((folds >= 0).all())
    for fold in range(5):
        hidden = folds == fold
        for task in range(3):  # a task keeps rows in every fold
            assert bool((~hidden & (data.task == task)).any())
        assert len(torch.unique(data.task[hidden])) > 1  # several tasks, in different regions
    # a task hides its regions in turn: region = (fold + task) mod K is one region per fold
    one = data.task == 0
    assert len(torch.unique(folds[one])) == 5


@pytest.mark.parametrize("noise", ["correlated", "independent"])
def test_held_out_predictions_of_the_exact_gp_are_the_gaussian_conditional_of_every_fold(noise):
    """With every input an inducing input, cGP is the exact GP: refitting only q(u) at fixed
    hyperparameters, each fold's prediction of a hidden row is E[y_i | y_kept] of the joint
    Gaussian."""
    data = heterotopic_data()
    model = randomise(build_model("cgp", data, MultitaskOptions(jitter=1e-10, noise=noise)))
    if noise == "correlated":
        model.site_noise.correlation_raw.data = torch.tensor([0.6, -0.4, 0.3],
                                                             dtype=torch.float64)

    def posterior_at_fixed_hyperparameters(rows: TaskData):
        model.bind(rows)
        NaturalGradient(model, 1.0)(lambda: -model.elbo())
        return model

    predictions = held_out_predictions(data, posterior_at_fixed_hyperparameters)
    model.bind(data)
    covariance = exact_covariance(model, data.X, data.task)
    folds = fold_of_rows(data)
    expected = torch.empty_like(data.y)
    for fold in range(HELD_OUT_FOLDS):
        hidden = folds == fold
        expected[hidden] = covariance[hidden][:, ~hidden] @ torch.linalg.solve(
            covariance[~hidden][:, ~hidden], data.y[~hidden])
    torch.testing.assert_close(predictions, expected, rtol=1e-7, atol=1e-10)
    squared = (expected - data.y).square()
    per_task = torch.stack([squared[data.task == task].mean() for task in range(3)])
    missing = 14 - torch.bincount(data.task).to(per_task.dtype)   # the third output's 4 gaps
    assert held_out_error(data, posterior_at_fixed_hyperparameters) == pytest.approx(
        float((missing * per_task).sum() / missing.sum()))


def test_outputs_weigh_by_their_gaps_and_equally_without_any():
    """w_t counts the inputs where output t is missing (what a user would predict); a table
    without gaps weighs every output the same."""
    data = heterotopic_data()
    assert gap_weights(data).tolist() == [0.0, 0.0, 4.0]
    two_gaps = data.task != 1
    two_gaps[(data.task == 1).nonzero()[:5, 0]] = True      # the second output at 5 of 14
    thinned = TaskData(data.X[two_gaps], data.task[two_gaps], data.y[two_gaps], 3)
    assert gap_weights(thinned).tolist() == [0.0, 9.0, 4.0]
    full = data.task != 2
    isotopic = TaskData(data.X[full], data.task[full], data.y[full], 2)
    assert gap_weights(isotopic).tolist() == [0.0, 0.0]
    spec = MultitaskSpec(num_inducing=14, noise="independent")

    def fit_rows(rows):
        return _fitted(spec, rows, default_config(spec), seed=0)

    squared = (held_out_predictions(isotopic, fit_rows) - isotopic.y).square()
    per_task = [float(squared[isotopic.task == task].mean()) for task in range(2)]
    assert held_out_error(isotopic, fit_rows) == pytest.approx(sum(per_task) / 2, rel=1e-9)


def test_a_held_out_prediction_never_sees_the_value_it_predicts():
    """Hyperparameters refitted per fold: moving a row's target moves the other folds' fits
    but not the prediction of that row (a fit to every row would carry it)."""
    data = heterotopic_data()
    spec = replace(MultitaskSpec(num_inducing=14, noise="correlated"), coregional_rank=2)

    def fit_rows(rows):
        return _fitted(spec, rows, default_config(spec), seed=0)

    before = held_out_predictions(data, fit_rows)
    moved = data.y.clone()
    moved[5] += 3.0
    after = held_out_predictions(TaskData(data.X, data.task, moved, 3), fit_rows)
    assert float(after[5]) == pytest.approx(float(before[5]), abs=1e-8)
    assert float((after - before).abs().max()) > 1e-3


def test_a_model_without_a_closed_form_optimum_has_no_held_out_error():
    data, _ = toy_data(10)
    with pytest.raises(ValueError, match="single-layer"):
        held_out_error(data, lambda rows: build_model("smdgp", rows,
                                                      MultitaskOptions(num_inducing=4)))


def test_the_default_cgp_candidates():
    spec = MultitaskSpec(model="cgp", num_inducing=9)
    candidates = [(each.coregional_rank, each.num_inducing, each.noise)
                  for each in default_candidates(spec, 3)]
    assert candidates == [(2, 9, "correlated"), (2, 9, "independent"),
                          (3, 6, "correlated"), (3, 6, "independent")]
    assert [each.learn_inducing for each in default_candidates(spec, 3)] == [None, None,
                                                                             False, False]
    assert [(each.coregional_rank, each.noise) for each in default_candidates(spec, 2)] == [
        (None, "correlated"), (None, "independent")]
    given = default_candidates(replace(spec, coregional_rank=2, noise="independent"), 3)
    assert [(each.coregional_rank, each.noise) for each in given] == [(2, "independent")]
    assert len(default_candidates(replace(spec, likelihood="bernoulli"), 3)) == 2
    assert len(default_candidates(replace(spec, model="igp"), 3)) == 1
    assert len(default_candidates(spec, 1)) == 1


def test_a_default_cgp_fits_the_candidate_that_predicts_held_out_stretches_best():
    """Every candidate's held-out error is computed (each fold fitted as the candidate is); the
    one with the lowest is fitted to all rows, and every candidate has a phase with its error
    (the others with no steps and no ELBO)."""
    pairs = toy_tasks(20, seed=0)
    X, generator = pairs[0][0], torch.Generator().manual_seed(0)
    third = pairs[0][1] - pairs[1][1] + 0.3 * torch.randn(len(X), generator=generator).numpy()
    pairs = [*pairs, (X, third)]
    spec = MultitaskSpec(model="cgp", num_inducing=9)
    candidates = default_candidates(spec, 3)
    rows = TaskData.from_list(pairs).in_canonical_order()
    data = TaskStandardisation.from_data(rows).transform(rows)
    errors = [held_out_error(data, _fold_fitter(each, default_config(each), seed=0))
              for each in candidates]
    assert len(set(errors)) == 4
    fit = fit_multitask_dgp(pairs, spec)
    best = candidates[errors.index(min(errors))]
    alone = fit_multitask_dgp(pairs, best)
    assert fit.elbo == alone.elbo and fit.steps == alone.steps
    assert (fit.model.options.coregional_rank, fit.model.options.noise) == (
        best.coregional_rank, best.noise)
    assert [phase.held_out for phase in fit.phases] == pytest.approx(errors, rel=1e-9)
    assert [phase.elbo for phase in fit.phases] == [
        alone.elbo if each is best else None for each in candidates]
    assert [phase.model for phase in fit.phases] == [
        "cgp (R = 2, correlated noise)", "cgp (R = 2, independent noise)",
        "cgp (R = 3, correlated noise)", "cgp (R = 3, independent noise)"]


def test_the_order_of_the_rows_changes_nothing():
    """A fit depends on its rows, not on their order: given task by task, site by site (as a
    wide table gives them) or shuffled, the rows give the same held-out errors, the same kept
    candidate, ELBO and predictions, to the last digit."""
    data = heterotopic_data()
    site_by_site = torch.argsort(data.X[:, 0] * data.num_tasks + data.task, stable=True)
    shuffled = torch.randperm(data.num_points, generator=torch.Generator().manual_seed(1))
    spec = MultitaskSpec(model="cgp", num_inducing=6)
    fits = [fit_multitask_dgp(TaskData(data.X[order], data.task[order], data.y[order],
                                       data.num_tasks), spec)
            for order in (torch.arange(data.num_points), site_by_site, shuffled)]
    first = fits[0]
    assert len({phase.held_out for phase in first.phases}) == 4
    for other in fits[1:]:
        assert [phase.held_out for phase in other.phases] == [
            phase.held_out for phase in first.phases]
        assert other.elbo == first.elbo
        for before, after in zip(first.predictor.predict_y(data.X, data.task),
                                 other.predictor.predict_y(data.X, data.task), strict=True):
            assert torch.equal(before, after)


def test_the_candidates_folds_show_one_progress_bar(capsys):
    """With ``progress`` the folds of every candidate tick one bar, named by the candidate, to
    its end; a fold's fit shows no bar of its own (the trainer's "fit" bar of its 20 steps)."""
    spec = MultitaskSpec(model="cgp", num_inducing=6)
    config = replace(default_config(spec), progress=True)
    fit_multitask_dgp(heterotopic_data(), spec, config)
    shown = capsys.readouterr().err
    total = len(default_candidates(spec, 3)) * HELD_OUT_FOLDS
    assert "held-out folds" in shown and f"{total}/{total}" in shown
    for candidate in default_candidates(spec, 3):
        assert _label(candidate) in shown
    assert not re.search(r"fit:[^\r\n]*/20\b", shown)


def copies_on_a_fold() -> list:
    """Three outputs at 20 inputs, the third the first less half the second interpolated to
    its inputs: their correlation over all 20 inputs is short of 1, but exactly 1 where a fold
    keeps both (:func:`test_a_candidate_whose_held_out_fold_fails_is_dropped_with_a_warning`)."""
    pairs = toy_tasks(20, seed=0)
    X = pairs[0][0]
    return [*pairs, (X, pairs[0][1] - 0.5 * np.interp(X[:, 0], pairs[1][0][:, 0], pairs[1][1]))]


def test_a_candidate_whose_held_out_fold_fails_is_dropped_with_a_warning():
    """A fold keeps fewer rows than the fit to all rows: here the first and third outputs are
    exact linear copies where a fold keeps both, so a correlated-noise fit of that fold fails
    (their noises cannot be told apart) while the full data fit. The default fit drops those
    candidates with a warning, records no held-out error for them, and keeps the best of the
    rest, fitted to all rows."""
    pairs = copies_on_a_fold()
    data = TaskStandardisation.from_data(TaskData.from_list(pairs)).transform(
        TaskData.from_list(pairs))
    sites = SiteLayout.of(data.X, data.task, 3)
    require_distinct_outputs(sites, data.y)  # all rows: not copies
    folds = fold_of_rows(data)
    failing = 0
    for fold in range(HELD_OUT_FOLDS):
        kept = folds != fold
        try:
            require_distinct_outputs(
                SiteLayout.of(data.X[kept], data.task[kept], 3), data.y[kept])
        except DataError:
            failing += 1
    assert failing > 0
    spec = MultitaskSpec(model="cgp", num_inducing=9)
    with pytest.warns(CandidateDroppedWarning, match="exact linear copies") as caught:
        fit = fit_multitask_dgp(pairs, spec)
    dropped = [str(each.message).split(" dropped")[0] for each in caught
               if each.category is CandidateDroppedWarning]
    assert dropped == ["candidate R = 2, correlated noise", "candidate R = 3, correlated noise"]
    errors = {phase.model: phase.held_out for phase in fit.phases}
    assert errors["cgp (R = 2, correlated noise)"] is None
    assert errors["cgp (R = 3, correlated noise)"] is None
    independent = {rank: errors[f"cgp (R = {rank}, independent noise)"] for rank in (2, 3)}
    best = min(independent, key=independent.get)
    assert (fit.model.options.coregional_rank, fit.model.options.noise) == (best, "independent")


def test_when_every_candidate_fold_fails_the_first_failure_is_raised(monkeypatch):
    def failing_fitter(spec, config, seed, on_fit=None):
        def fit_rows(rows):
            raise CholeskyError(f"no factorisation for R = {spec.coregional_rank}, {spec.noise}")
        return fit_rows

    monkeypatch.setattr(multitask_fit, "_fold_fitter", failing_fitter)
    pairs = toy_tasks(10, seed=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CandidateDroppedWarning)
        with pytest.raises(CholeskyError, match="R = None, correlated"):
            fit_multitask_dgp(pairs, MultitaskSpec(model="cgp", num_inducing=4))


def test_the_candidate_comparison_in_float32_chooses_as_in_float64():
    """The held-out errors of the candidates in float32 agree with float64's to within the
    rounding's share (a fold's fit stops after a few steps, where rounding can move it), and the
    same candidate is kept, with the same ELBO to a few digits."""
    pairs = copies_on_a_fold()
    noise = 0.3 * np.random.default_rng(0).normal(size=len(pairs[2][1]))
    pairs[2] = (pairs[2][0], pairs[2][1] + noise)
    fits = {dtype: fit_multitask_dgp(pairs, MultitaskSpec(model="cgp", num_inducing=9,
                                                          dtype=dtype))
            for dtype in (torch.float32, torch.float64)}
    single, double = fits[torch.float32], fits[torch.float64]
    assert {parameter.dtype for parameter in single.model.parameters()} == {torch.float32}
    assert [phase.held_out for phase in single.phases] == pytest.approx(
        [phase.held_out for phase in double.phases], rel=2e-2)
    assert [phase.elbo is None for phase in single.phases] == [
        phase.elbo is None for phase in double.phases]
    assert single.elbo == pytest.approx(double.elbo, abs=1e-2)


def test_a_cgp_classifier_compares_its_ranks_by_their_elbo():
    """Without a closed-form q(u) optimum there is no held-out error: every rank is fitted and
    the higher ELBO kept."""
    data, _ = toy_data(12, likelihood="bernoulli")
    third = (data.X[data.task == 0, 0] > 0).double()
    pairs = [(data.X[data.task == t].numpy(), data.y[data.task == t].numpy()) for t in range(2)]
    pairs.append((data.X[data.task == 0].numpy(), third.numpy()))
    spec = MultitaskSpec(model="cgp", likelihood="bernoulli", num_inducing=4)
    config = replace(default_config(spec), steps=20)
    fits = [fit_multitask_dgp(pairs, each, config) for each in default_candidates(spec, 3)]
    fit = fit_multitask_dgp(pairs, spec, config)
    assert fit.elbo == max(each.elbo for each in fits)
    assert [phase.elbo for phase in fit.phases] == [each.elbo for each in fits]
    assert [phase.held_out for phase in fit.phases] == [None, None]
    assert [phase.model for phase in fit.phases] == ["cgp (R = 2)", "cgp (R = 3)"]
