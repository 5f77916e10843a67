"""How multitask models start and train: at zero KL, at the shallow model they contain, never
ending below it; Pyro's Trace_ELBO agrees with TraceMeanField_ELBO (float64, the paper's toy)."""

import math
import warnings
from dataclasses import replace

import numpy as np
import pyro
import pytest
import torch
from pyro.infer import Trace_ELBO, TraceMeanField_ELBO
from pyrogp_models.inference.multitask_fit import (
    MultitaskSpec,
    _start_deep,
    default_config,
    estimate_elbo,
    fit_multitask_dgp,
)
from pyrogp_models.inference.trainer import TrainConfig, train

from multitask_helpers import randomise, toy_data, toy_model
from pyrogp_models.errors import ConstantFitWarning
from pyrogp_models.models.multitask import MODELS, build_model, toy_tasks
from pyrogp_models.models.multitask.options import MAX_DEFAULT_TASK_INDUCING, MultitaskOptions
from pyrogp_models.models.multitask.warm_start import (
    CONTAINED,
    LATENT_LENGTHSCALE,
    SWITCHED_OFF,
    embed_shallow,
    embed_transfer,
    source_task,
    transfer_column,
)

DEEP = sorted(CONTAINED)


@pytest.fixture(autouse=True)
def float64():
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(previous)


@pytest.mark.parametrize("kind", DEEP)
def test_a_deep_model_starts_at_zero_inner_kl(kind):
    model = toy_model(kind)
    assert float(model.latent.kl()) == 0.0
    for _, block in model.latent.blocks():
        eye = torch.eye(block.layer.num_inducing).expand_as(block.layer.q_sqrt)
        assert torch.equal(block.layer.q_sqrt.detach(), eye)


def loss_estimates(model, elbo, draws: int) -> torch.Tensor:
    pyro.set_rng_seed(3)
    with torch.no_grad():
        return torch.stack([elbo.differentiable_loss(model.model, model.guide)
                            for _ in range(draws)])


def assert_estimators_agree(model, draws: int = 200) -> None:
    """Trace_ELBO adds log q(v) − log p(v) − KL of a draw, zero in expectation: both estimators
    are finite and agree within four standard errors."""
    plain = loss_estimates(model, Trace_ELBO(), draws)
    mean_field = loss_estimates(model, TraceMeanField_ELBO(), draws)
    assert bool(torch.isfinite(plain).all()) and bool(torch.isfinite(mean_field).all())
    error = math.sqrt((plain.var() + mean_field.var()) / draws)
    assert abs(float(plain.mean() - mean_field.mean())) <= 4 * error + 1e-9


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_trace_elbo_agrees_with_mean_field_at_the_start_and_after_training(kind):
    model = toy_model(kind, num_points=15, num_inducing=6)
    assert_estimators_agree(model)
    train(model, config=TrainConfig(lr=0.02, steps=150, tol=None, seed=0))
    assert_estimators_agree(model)


@pytest.mark.parametrize("kind", DEEP)
def test_a_deep_model_embedding_its_shallow_model_has_the_shallow_elbo(kind):
    data, _ = toy_data(20, gap=(0.3, 0.6))
    shallow = randomise(build_model(CONTAINED[kind], data, MultitaskOptions(num_inducing=7)))
    deep = build_model(kind, data, MultitaskOptions(num_inducing=7))
    assert embed_shallow(deep, shallow, SWITCHED_OFF)
    assert estimate_elbo(deep) == pytest.approx(float(shallow.elbo()), rel=1e-6)
    # at the training start (a small inner variance) the predictions are nearly the shallow ones
    embed_shallow(deep, shallow)
    x = data.X[:5].unsqueeze(0).expand(2, -1, -1)
    _, deep_mean, _ = deep.output_moments(x, deep.draw_noise(1, (2, 5), x))
    _, shallow_mean, _ = shallow.output_moments(x, None)
    assert torch.allclose(deep_mean[0], shallow_mean[0], atol=0.05)


def test_a_deep_model_that_cannot_embed_its_shallow_model_keeps_that_model_itself():
    """Four inputs through shared processes of width 2: W_λ mixes inputs, so the embedding is
    not iGP (its ELBO is lower). A deep fit stopped after one step ends below iGP's own ELBO, and
    the fit returns iGP itself: it predicts exactly as iGP fitted alone."""
    generator = np.random.default_rng(3)
    tasks = []
    for scale in (1.0, -0.5):
        X = generator.uniform(-1, 1, (30, 4))
        tasks.append((X, scale * np.sin(2 * X[:, 0] + X[:, 1]) + 0.1 * X[:, 2]
                      + 0.05 * generator.standard_normal(30)))
    spec = MultitaskSpec(model="smdgp", shared_width=2, num_inducing=8)
    data = fit_multitask_dgp(tasks, replace(spec, model="igp")).data
    deep, shallow = build_model("smdgp", data, spec.options()), build_model("igp", data,
                                                                             spec.options())
    assert not embed_shallow(deep, shallow, SWITCHED_OFF)
    fit = fit_multitask_dgp(tasks, spec, TrainConfig(lr=0.01, steps=1, tol=None, seed=0))
    alone = fit_multitask_dgp(tasks, replace(spec, model="igp"),
                              replace(default_config(replace(spec, model="igp")), seed=0))
    assert [phase.model for phase in fit.phases] == ["igp", "smdgp"]
    assert fit.phases[1].elbo < fit.phases[0].elbo
    assert fit.kept == "igp" and fit.model.kind == "igp" and fit.elbo == fit.phases[0].elbo
    X, labels = torch.as_tensor(tasks[1][0][:6]), torch.ones(6, dtype=torch.long)
    for kept, fitted_alone in zip(fit.predictor.predict_y(X, labels),
                                  alone.predictor.predict_y(X, labels), strict=True):
        assert torch.equal(kept, fitted_alone)


@pytest.mark.parametrize("source", [0, 1])
def test_a_transfer_start_puts_the_source_tasks_gp_in_the_shared_column(source):
    """The free shared column's q marginals are iGP's of the source task; the private columns
    are the inputs; every top GP sees the latent alone, its linear mean the least-squares line of
    the task's targets on ḡ (residuals orthogonal to ḡ)."""
    data, _ = toy_data(20, gap=(0.3, 0.6))
    options = MultitaskOptions(num_inducing=7)
    shallow = randomise(build_model("igp", data, options))
    deep = randomise(build_model("mmdgp", data, options), seed=2)
    column = transfer_column(deep)
    assert column == 1 and transfer_column(build_model("smdgp", data, options)) is None
    embed_transfer(deep, shallow, source)
    x = torch.linspace(-2.0, 2.0, 9).reshape(1, 9, 1)
    shared_mean, shared_var = deep.latent.shared.marginals(x)
    igp_mean, igp_var = shallow.top.layer.marginals(x.unsqueeze(1))
    torch.testing.assert_close(shared_mean[0, :, column], igp_mean[source, 0], rtol=1e-12,
                               atol=1e-12)
    torch.testing.assert_close(shared_var[0, :, column], igp_var[source, 0], rtol=1e-12,
                               atol=1e-12)
    private_mean, private_var = deep.latent.private.marginals(x)
    torch.testing.assert_close(private_mean[..., 0], x[..., 0].expand(2, -1))
    assert float(private_var.max()) < 1e-10 and float(deep.latent.private.kl()) == 0.0
    lengthscale = deep.top.layer.kernel.lengthscale.squeeze(-2)
    assert bool((lengthscale[:, column] == LATENT_LENGTHSCALE).all())
    assert bool((lengthscale[:, :column] > 5 * LATENT_LENGTHSCALE).all())
    g = deep.latent.shared.marginals(data.X.unsqueeze(0))[0][0, :, column]
    slopes = deep.top.mean_weights.detach()[:, :, 0]
    assert bool((slopes[:, column] != 0).all()) and int((slopes != 0).sum()) == 2
    for task in range(2):
        rows = data.task == task
        residual = data.y[rows] - slopes[task, column] * g[rows]
        assert abs(float(residual @ g[rows])) < 1e-9 * float(g[rows].norm() * data.y[rows].norm())
    assert source_task(data.task, data.num_tasks) == int(torch.bincount(data.task).argmax())


def test_a_transfer_start_in_float32_keeps_its_identities_and_trains():
    """The transfer start's arithmetic keeps the model's dtype: in float32 the shared column's
    q marginals are the float32 iGP's of the source task and the linear means' residuals are
    orthogonal to ḡ, to float32 accuracy; the natural-gradient steps and training steps leave
    every parameter float32 and the ELBO finite."""
    shallow = fit_multitask_dgp(toy_tasks(20, gap=(0.3, 0.6), seed=0),
                                MultitaskSpec(model="igp", num_inducing=6, dtype=torch.float32))
    data, source = shallow.data, source_task(shallow.data.task, shallow.data.num_tasks)
    deep = build_model("mmdgp", data, MultitaskOptions(num_inducing=6))
    _start_deep(deep, shallow.model, default_config(MultitaskSpec(model="mmdgp")), "transfer")
    column = transfer_column(deep)
    x = data.X.unsqueeze(0)
    shared_mean, shared_var = deep.latent.shared.marginals(x)
    igp_mean, igp_var = shallow.model.top.layer.marginals(x.unsqueeze(1))
    assert shared_mean.dtype == torch.float32
    torch.testing.assert_close(shared_mean[0, :, column], igp_mean[source, 0])
    torch.testing.assert_close(shared_var[0, :, column], igp_var[source, 0])
    g, slopes = shared_mean[0, :, column], deep.top.mean_weights.detach()[:, column, 0]
    for task in range(data.num_tasks):
        rows = data.task == task
        residual = data.y[rows] - slopes[task] * g[rows]
        assert abs(float(residual @ g[rows])) < 1e-5 * float(g[rows].norm() * data.y[rows].norm())
    train(deep, config=TrainConfig(lr=0.01, steps=3, tol=None, seed=0, natural_gradient_lr=0.1))
    assert all(parameter.dtype == torch.float32 for parameter in deep.parameters())
    assert math.isfinite(float(deep.elbo()))


def test_a_deep_fit_stopped_by_patience_returns_to_its_best_precise_window_end_in_float32(
        monkeypatch):
    """The deep phase's windows are judged by :func:`estimate_elbo` at their ends (recorded
    here); a fit stopped by ``patience`` (Adam at a learning rate of 5, which wrecks the fit) is
    back at the window end with the highest of them: its phase's ELBO is that value. In float32
    (the default dtype float64: a tensor made without the model's dtype would show)."""
    import pyrogp_models.inference.multitask_fit as multitask_fit

    recorded = []

    def recording(model, num_samples=multitask_fit.ELBO_SAMPLES, seed=0):
        value = estimate_elbo(model, num_samples, seed)
        recorded.append(value)
        return value

    monkeypatch.setattr(multitask_fit, "estimate_elbo", recording)
    spec = MultitaskSpec(model="smdgp", num_inducing=6, dtype=torch.float32)
    config = TrainConfig(lr=5.0, steps=300, window=10, tol=None, patience=1, seed=0)
    fit = fit_multitask_dgp(toy_tasks(20, seed=0), spec, config)
    deep = fit.phases[1]
    assert deep.returned_to is not None  # the loss rose: stopped by patience
    windows = recorded[2:2 + deep.steps // config.window]  # after the shallow phase and start
    assert len(windows) == deep.steps // config.window
    assert deep.elbo == max(windows)
    assert all(parameter.dtype == torch.float32 for parameter in fit.model.parameters())


def test_a_deep_fit_wrecked_by_its_optimiser_keeps_the_shallow_model():
    pairs = toy_tasks(20, seed=1)
    wreck = TrainConfig(lr=3.0, steps=20, tol=None, seed=0)
    fit = fit_multitask_dgp(pairs, MultitaskSpec(model="smdgp", num_inducing=6), wreck)
    shallow = fit.phases[0]
    assert [phase.model for phase in fit.phases] == ["igp", "smdgp"]
    assert fit.phases[1].elbo < shallow.elbo and fit.kept == "igp"
    assert fit.elbo == pytest.approx(shallow.elbo, abs=1e-4)


def test_an_mmdgp_whose_transfer_start_ends_below_the_shallow_model_tries_the_shallow_start():
    pairs = toy_tasks(20, seed=1)
    wreck = TrainConfig(lr=3.0, steps=20, tol=None, seed=0)
    fit = fit_multitask_dgp(pairs, MultitaskSpec(model="mmdgp", num_inducing=6), wreck)
    assert [phase.model for phase in fit.phases] == ["igp", "mmdgp", "mmdgp"]
    assert max(phase.elbo for phase in fit.phases[1:]) < fit.phases[0].elbo
    assert fit.kept == "igp" and fit.elbo == pytest.approx(fit.phases[0].elbo, abs=1e-4)


def test_a_deep_fit_that_improves_keeps_the_deep_model():
    fit = fit_multitask_dgp(toy_tasks(20, seed=1), MultitaskSpec(model="smdgp", num_inducing=6),
                            TrainConfig(lr=0.01, steps=300, tol=None, seed=0,
                                        natural_gradient_lr=0.1))
    assert fit.kept == "smdgp" and fit.elbo == fit.phases[1].elbo > fit.phases[0].elbo


def test_the_default_inducing_inputs_are_the_largest_tasks_rows_up_to_a_cap():
    data, _ = toy_data(30, gap=(0.2, 0.5))
    counts = torch.bincount(data.task).tolist()
    assert build_model("igp", data).options.num_inducing == max(counts)
    cap = MAX_DEFAULT_TASK_INDUCING
    assert MultitaskOptions().with_inducing_for([5, 10**5]).num_inducing == cap
    assert MultitaskOptions(num_inducing=4).with_inducing_for([50]).num_inducing == 4


def test_shared_processes_and_coregionalised_gps_have_m_inducing_inputs_not_m_times_t():
    data, _ = toy_data(20)
    for kind in ("smdgp", "cmdgp", "cgp"):
        model = build_model(kind, data, MultitaskOptions(num_inducing=6))
        assert {layer.num_inducing for _, layer in model.variational_sites()} == {6}


def test_a_gaussian_igp_by_default_reaches_the_collapsed_optimum():
    """L-BFGS with q(u) at its optimum before every evaluation: the trained q(u) is optimal for
    the trained hyperparameters (another unit natural-gradient step changes the ELBO by
    rounding only)."""
    spec = MultitaskSpec(model="igp", num_inducing=8)
    fit = fit_multitask_dgp(toy_tasks(25, seed=2), spec)
    assert fit.result.converged and default_config(spec).optimizer == "lbfgs"
    from pyrogp_models.inference.natural_gradient import NaturalGradient

    before = float(fit.model.elbo())
    NaturalGradient(fit.model, 1.0)(lambda: -fit.model.elbo())
    assert float(fit.model.elbo()) == pytest.approx(before, abs=1e-6)


def test_a_classifier_stops_once_its_predictions_have_settled():
    """Without a collapsed bound L-BFGS fits q(u) with the hyperparameters; the default stops
    at 1e-5 (relative) over two steps, before the 1e-7 of a collapsed bound, with the same
    class probabilities (within 1e-3) and ELBO (within 1e-3 nats)."""
    tasks = [(X, (y > np.median(y)).astype(float)) for X, y in toy_tasks(30, seed=3)]
    spec = MultitaskSpec(model="cgp", likelihood="bernoulli")
    default = fit_multitask_dgp(tasks, spec)
    tight = fit_multitask_dgp(tasks, spec, replace(default_config(spec), tol=1e-7))
    assert default.converged and tight.converged and default.steps < tight.steps
    grid = torch.linspace(-0.2, 1.2, 50, dtype=torch.float64).unsqueeze(-1)
    for task in range(2):
        labels = torch.full((50,), task)
        settled = default.predictor.predict_y(grid, labels)[0]
        assert torch.allclose(settled, tight.predictor.predict_y(grid, labels)[0], atol=1e-3)
    assert default.elbo == pytest.approx(tight.elbo, abs=1e-3)


def _classification_on_twenty_inputs():
    """3 tasks of 40 training and 10 held-out rows on 20 standard normal inputs, each labelled
    by the side of one hyperplane (shifted per task) it lies on."""
    generator = np.random.default_rng(0)
    direction = generator.standard_normal(20) / math.sqrt(20)
    tasks, held_out = [], []
    for shift in (0.0, 0.5, -0.5):
        X = generator.standard_normal((50, 20))
        labels = (X @ direction + shift > 0).astype(float)
        tasks.append((X[:40], labels[:40]))
        held_out.append((torch.as_tensor(X[40:]), labels[40:]))
    return tasks, held_out


def test_a_classifier_on_many_inputs_learns_instead_of_predicting_one_half():
    """Every lengthscale starts at √D on D standardised inputs: at ℓ = 1, two points of 20
    inputs lie about √40 lengthscales apart, where the Matérn kernel all but vanishes and no
    gradient reaches ℓ, and a Bernoulli cGP shrinks its mixing to 0: the constant classifier,
    ELBO N·log ½, in a few steps (next test)."""
    tasks, held_out = _classification_on_twenty_inputs()
    spec = MultitaskSpec(model="cgp", likelihood="bernoulli", coregional_rank=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConstantFitWarning)
        fit = fit_multitask_dgp(tasks, spec)
    assert (fit.model.options.top_lengthscale is None
            and torch.allclose(build_model("cgp", fit.data, spec.options()).top.layer.kernel
                               .lengthscale, torch.tensor(math.sqrt(20))))
    assert fit.elbo > 120 * math.log(0.5) + 10
    assert fit.elbo > fit.constant_log_likelihood + 10
    correct = [(fit.predictor.predict_y(X, torch.full((len(X),), task))[0].numpy() > 0.5)
               == labels for task, (X, labels) in enumerate(held_out)]
    assert np.concatenate(correct).mean() >= 0.8


def test_a_fit_that_learns_nothing_from_its_inputs_says_so():
    """Started at ℓ = 1 on 20 inputs, the same cGP ends as the constant classifier: its ELBO
    is N·log ½, below the log likelihood of each task's own label frequency, which
    ``constant_log_likelihood`` computes independently of the fit, and the fit warns."""
    tasks, _ = _classification_on_twenty_inputs()
    labels = [torch.as_tensor(y) for _, y in tasks]
    frequencies = [float(y.mean()) for y in labels]
    by_hand = sum(float(y.sum()) * math.log(p) + float((1 - y).sum()) * math.log(1 - p)
                  for y, p in zip(labels, frequencies, strict=True))
    spec = MultitaskSpec(model="cgp", likelihood="bernoulli", coregional_rank=2,
                         top_lengthscale=1.0)
    with pytest.warns(ConstantFitWarning, match="learnt nothing from the inputs") as caught:
        fit = fit_multitask_dgp(tasks, spec)
    assert fit.constant_log_likelihood == pytest.approx(by_hand, rel=1e-12)
    assert fit.elbo == pytest.approx(120 * math.log(0.5), abs=1e-3)
    assert [warning.message.elbo for warning in caught
            if warning.category is ConstantFitWarning] == [fit.elbo]
    assert fit.summary()["constant_log_likelihood"] == fit.constant_log_likelihood


def test_an_igp_task_fitted_beside_others_ends_where_it_ends_alone():
    """iGP's tasks are independent problems on its collapsed bound: the batched L-BFGS gives
    each its own memory and step length and pins it at its optimum, so a task's predictions do
    not depend on the tasks fitted beside it."""
    (X, y0), (_, y1) = toy_tasks(25, seed=2)
    y1 = np.sin(6 * X[:, 0]) + 0.1 * np.cos(40 * X[:, 0])  # another task at the same X
    spec = MultitaskSpec(model="igp")
    beside = fit_multitask_dgp([(X, y0), (X, y1)], spec)
    alone = fit_multitask_dgp([(X, y0)], spec)
    assert beside.model.member_objectives() is None  # outside the collapsed objective
    grid = torch.linspace(-0.2, 1.2, 50).unsqueeze(-1)
    labels = torch.zeros(50, dtype=torch.long)
    mean_beside, var_beside = beside.predictor.predict_y(grid, labels)
    mean_alone, var_alone = alone.predictor.predict_y(grid, labels)
    assert beside.result.member_converged == [True, True]  # judged task by task
    assert alone.result.member_converged == [True]
    assert torch.allclose(mean_beside, mean_alone, rtol=1e-6, atol=1e-6)
    assert torch.allclose(var_beside, var_alone, rtol=1e-5, atol=1e-8)


def test_only_an_igp_on_its_collapsed_bound_splits_into_task_members():
    data, _ = toy_data(20)
    for kind, independent in (("igp", True), ("cgp", False)):
        model = build_model(kind, data, MultitaskOptions(num_inducing=6, noise="independent"))
        with model.collapsed_objective():
            members = model.member_objectives()
            assert (members is not None) == independent
            if independent:
                (_, objective), = members
                assert torch.allclose(-objective().sum(), model.collapsed_bound())


def test_single_layer_models_take_natural_gradient_steps_only_on_a_deterministic_expectation():
    """A softmax's expectation is a Monte Carlo estimate, so a safeguarded (non-conjugate) step
    would be judged by two estimates with different draws: Adam takes q(u) with the rest.
    With minibatches and a deterministic expectation the unit steps stay."""
    softmax = MultitaskSpec(model="igp", likelihood="categorical",
                            likelihood_options={"num_classes": 3})
    robustmax = replace(softmax, likelihood_options={"num_classes": 3, "link": "robustmax"},
                        batch_size=10)
    assert default_config(softmax).natural_gradient_lr is None
    assert default_config(replace(softmax, model="cgp")).natural_gradient_lr is None
    assert default_config(robustmax).natural_gradient_lr == 1.0
    assert default_config(MultitaskSpec(model="cgp", batch_size=10)).natural_gradient_lr == 1.0
    assert default_config(replace(softmax, model="smdgp")).natural_gradient_lr is None


def test_a_deep_classifier_on_separable_labels_stays_finite():
    """A learned linear mean of the logits is a logistic regression without a prior: where the
    classes are linearly separable its weights grow without bound (an sMDGP with
    ``top_mean="linear"`` on these labels ran 17808 steps to probabilities 1 − 10⁻⁷⁰). By default
    a deep classifier's top mean is zero, as a Gaussian model's is linear: it converges, and
    points well inside either class get probabilities short of 0 and 1."""
    generator = np.random.default_rng(0)
    tasks = []
    for shift in (0.0, 0.1):
        X = generator.uniform(-1, 1, (30, 2))
        tasks.append((X, (X[:, 0] + 0.5 * X[:, 1] > shift).astype(float)))
    spec = MultitaskSpec(model="smdgp", likelihood="bernoulli")
    assert spec.options().resolved("smdgp", 2, 2).top_mean == "zero"
    assert MultitaskSpec(model="smdgp").options().resolved("smdgp", 2, 2).top_mean == "linear"
    fit = fit_multitask_dgp(tasks, spec)
    inside = torch.tensor([[0.9, 0.0], [-0.9, 0.0]], dtype=torch.float64)
    probability = fit.predictor.predict_y(inside, torch.zeros(2, dtype=torch.long))[0]
    assert fit.converged
    assert 0.9 < probability[0] < 1 - 1e-6 and 1e-6 < probability[1] < 0.1
