"""The batched SVGP against the exact GP, against single fits and against Pyro's own ELBO."""

import math
import warnings
from dataclasses import replace

import numpy as np
import pyro
import pytest
import torch
from pyrogp_models.inference.local_fit import LocalFitSpec, default_config, fit_local
from pyrogp_models.inference.metrics import nlpd
from pyrogp_models.inference.train_config import UNCOLLAPSED_CONFIG
from pyrogp_models.inference.trainer import TrainConfig, train

from pyrogp_models.data.partitioners import Partition, partition_contiguous, partition_random
from pyrogp_models.errors import NotConvergedWarning
from pyrogp_models.gaussian.kullback_leiblers import kl_to_standard_normal
from pyrogp_models.kernels import Stationary
from pyrogp_models.likelihoods import Gaussian, make_likelihood
from pyrogp_models.models.local.collapsed import collapsed_bound, set_optimal_posterior
from pyrogp_models.models.local.local_gps import LocalGPs
from pyrogp_models.models.local.svgp import BatchedSVGP


def random_cholesky(*shape):
    A = torch.randn(*shape, shape[-1])
    return torch.linalg.cholesky(A @ A.mT + 0.5 * torch.eye(shape[-1]))


def padded_cosine_series(K, N, kept):
    """K series of N noisy cos(2x) points on [0, 4]; series k keeps its first ``kept[k]`` points
    (all N where k is not in ``kept``) and the rest is padding, masked out."""
    X = torch.rand(K, N, 1) * 4
    y = torch.cos(2 * X[..., 0]) + 0.1 * torch.randn(K, N)
    mask = torch.ones(K, N, dtype=torch.bool)
    for k, count in kept.items():
        mask[k, count:] = False
    return X, y, mask


def test_kl_terms_equal_torch_distributions():
    mean, chol = torch.randn(4, 6), random_cholesky(4, 6)
    q = torch.distributions.MultivariateNormal(mean, scale_tril=chol)
    standard = torch.distributions.MultivariateNormal(torch.zeros(6), torch.eye(6))
    assert torch.allclose(kl_to_standard_normal(mean, chol),
                          torch.distributions.kl_divergence(q, standard), rtol=0, atol=1e-10)


def exact_gp(X, y, Xs, lengthscale, variance, noise):
    """Textbook GP regression in float64 numpy (Rasmussen & Williams, Alg. 2.1)."""
    def k(a, b):
        return variance * np.exp(-0.5 * (a[:, None, 0] - b[None, :, 0]) ** 2 / lengthscale**2)
    L = np.linalg.cholesky(k(X, X) + noise * np.eye(len(X)))
    alpha = np.linalg.solve(L.T, np.linalg.solve(L, y))
    Ks = k(X, Xs)
    v = np.linalg.solve(L, Ks)
    mean, var = Ks.T @ alpha, variance - (v**2).sum(0)
    lml = -0.5 * y @ alpha - np.log(np.diag(L)).sum() - 0.5 * len(X) * math.log(2 * math.pi)
    return lml, mean, var


def single_svgp_at_data(X, y, noise=0.05):
    kernel = Stationary("rbf", 1, (1, 1), False, 0.6, 1.3)
    likelihood = Gaussian((1,), variance=noise)
    return BatchedSVGP(X.unsqueeze(0).clone(), kernel, likelihood, X.unsqueeze(0),
                       y.unsqueeze(0), learn_inducing=False, jitter=1e-12)


def test_svgp_with_inducing_at_data_is_the_exact_gp():
    torch.manual_seed(3)
    X = torch.rand(25, 1) * 6
    y = torch.sin(X[:, 0]) + 0.2 * torch.randn(25)
    Xs = torch.linspace(-1, 7, 40).unsqueeze(-1)
    lml, mean, var = exact_gp(X.numpy(), y.numpy(), Xs.numpy(), 0.6, 1.3, 0.05)
    model = single_svgp_at_data(X, y)
    mask = torch.ones(1, 25, dtype=torch.bool)
    # Optimise q(u) by L-BFGS with the hyperparameters held fixed.
    for p in [*model.kernel.parameters(), *model.likelihood.parameters()]:
        p.requires_grad_(False)
    train(model, config=TrainConfig(optimizer="lbfgs", lr=1.0, steps=300, window=10, tol=1e-12))
    elbo = model.elbo(X.unsqueeze(0), y.unsqueeze(0), mask).item()
    assert elbo == pytest.approx(lml, rel=1e-6)
    assert collapsed_bound(model, X.unsqueeze(0), y.unsqueeze(0), mask).item() == \
        pytest.approx(lml, rel=1e-8)
    pred_mean, pred_var = model.latent(Xs.unsqueeze(0))
    assert np.allclose(pred_mean[0].detach().numpy(), mean, atol=1e-6)
    assert np.allclose(pred_var[0].detach().numpy(), var, atol=1e-6)


def test_collapsed_optimum_attains_the_collapsed_bound_with_padding():
    torch.manual_seed(4)
    K, N, M = 3, 30, 7
    X, y, mask = padded_cosine_series(K, N, kept={0: 20, 2: 11})
    model = BatchedSVGP(torch.rand(K, M, 1) * 4, Stationary("matern52", 1, (K, 1), False, 0.8, 1.1),
                        Gaussian((K,), variance=0.03))
    bound = collapsed_bound(model, X, y, mask)
    set_optimal_posterior(model, X, y, mask)
    assert torch.allclose(model.elbo(X, y, mask), bound, rtol=1e-9)
    # Padding is invisible: the bound of partition 2 equals that computed on its 11 points alone.
    alone = BatchedSVGP(model.inducing[2:3].detach(), Stationary("matern52", 1, (1, 1), False,
                                                                  0.8, 1.1),
                        Gaussian((1,), variance=0.03))
    single = collapsed_bound(alone, X[2:3, :11], y[2:3, :11], torch.ones(1, 11, dtype=bool))
    assert single.item() == pytest.approx(bound[2].item(), rel=1e-12)


def test_pyro_loss_is_the_negative_analytic_elbo_and_minibatches_are_unbiased():
    torch.manual_seed(5)
    K, N = 2, 40
    X, y = torch.rand(K, N, 1), torch.randn(K, N)
    mask = torch.ones(K, N, dtype=torch.bool)
    mask[1, 25:] = False
    model = BatchedSVGP(torch.rand(K, 5, 1), Stationary("rbf", 1, (K, 1)), Gaussian((K,)), X, y,
                        mask)
    with torch.no_grad():
        model.q_mean = torch.randn(K, 1, 5)
    elbo = pyro.infer.TraceMeanField_ELBO()
    loss = elbo.differentiable_loss(model.model, model.guide)
    analytic = model.expected_log_lik(X, y, mask.to(X.dtype)) - model.kl()
    assert loss.item() == pytest.approx(-analytic.sum().item(), rel=1e-12)
    model.batch_size = 8  # positions drawn without replacement, scaled N/B
    with torch.no_grad():
        estimates = torch.stack([model.data_term().sum() for _ in range(3000)]) - model.kl().sum()
        plated = torch.stack([-elbo.differentiable_loss(model.model, model.guide)
                              for _ in range(3000)])
    full = model.elbo(X, y, mask).sum().item()
    standard_error = plated.std() / math.sqrt(len(plated))
    assert abs(plated.mean().item() - full) < 4 * standard_error.item()
    standard_error = estimates.std() / math.sqrt(len(estimates))
    assert abs(estimates.mean().item() - full) < 4 * standard_error.item()
    assert standard_error.item() > 0


@pytest.mark.parametrize("family", ["rbf", "matern32"])
@pytest.mark.parametrize("likelihood", ["gaussian", "bernoulli", "poisson"])
def test_inverse_form_equals_projected_form(family, likelihood):
    """mean = K_xzα, var = k_xx + K_xzBK_zx gives the projected form's data term and gradients."""
    torch.manual_seed(6)
    K, N, M = 3, 40, 6
    X = torch.rand(K, N, 1) * 3
    f = torch.sin(2 * X[..., 0])
    y = {"gaussian": f + 0.1 * torch.randn(K, N), "bernoulli": (f > 0).to(X.dtype),
         "poisson": torch.poisson(f.exp())}[likelihood]
    weights = torch.ones(K, N)
    weights[1, 30:] = 0.0  # padding
    weights[2] = 2.5  # minibatch rescaling
    model = BatchedSVGP(torch.linspace(0, 3, M).expand(K, M).unsqueeze(-1).clone(),
                        Stationary(family, 1, (K, 1), False, 0.7, 1.2),
                        make_likelihood(likelihood, (K,)))
    with torch.no_grad():
        model.q_mean = torch.randn(K, 1, M)
        model.q_sqrt = random_cholesky(K, 1, M) * 0.5
    assert model.inverse_form()

    def value_and_gradients(inverse_form):
        value = model.expected_log_lik(X, y, weights, inverse_form=inverse_form)
        return value, torch.autograd.grad(value.sum(), list(model.parameters()))

    inverse, inverse_grads = value_and_gradients(True)
    projected, projected_grads = value_and_gradients(False)
    assert torch.allclose(inverse, projected, rtol=1e-10, atol=0)
    for a, b in zip(inverse_grads, projected_grads, strict=True):
        assert torch.allclose(a, b, rtol=1e-7, atol=1e-7 * b.abs().max().item())
    mean_i, var_i = model.latent(X, inverse_form=True)
    mean_p, var_p = model.latent(X, inverse_form=False)
    assert torch.allclose(mean_i, mean_p, atol=1e-10) and torch.allclose(var_i, var_p, atol=1e-10)


def test_collapsed_bound_from_gram_statistics_equals_projected_form():
    torch.manual_seed(7)
    K, N, M = 3, 30, 6
    X, y, mask = padded_cosine_series(K, N, kept={0: 18})
    model = BatchedSVGP(torch.linspace(0, 4, M).expand(K, M).unsqueeze(-1).clone(),
                        Stationary("rbf", 1, (K, 1), False, 0.8, 1.1),
                        Gaussian((K,), variance=0.03))
    inverse = collapsed_bound(model, X, y, mask, inverse_form=True)
    projected = collapsed_bound(model, X, y, mask, inverse_form=False)
    assert torch.allclose(inverse, projected, rtol=1e-10, atol=0)
    grads = [torch.autograd.grad(collapsed_bound(model, X, y, mask, inverse_form=form).sum(),
                                 list(model.parameters()), allow_unused=True)
             for form in (True, False)]
    for a, b in zip(*grads, strict=True):
        if b is not None:
            assert torch.allclose(a, b, rtol=1e-7, atol=1e-7 * b.abs().max().item())


def test_inverse_form_only_where_it_is_accurate():
    def model(dtype, jitter):
        return BatchedSVGP(torch.rand(1, 4, 1, dtype=dtype), Stationary("rbf", 1, (1, 1),
                                                                        dtype=dtype),
                           Gaussian((1,), dtype=dtype), jitter=jitter)
    assert model(torch.float64, 1e-6).inverse_form()
    assert not model(torch.float64, 1e-12).inverse_form()
    assert not model(torch.float32, 1e-6).inverse_form()


def test_learned_inducing_inputs_stay_with_narrow_contiguous_partitions():
    """Z is optimised in each partition's own coordinates: with 20 partitions of width 1 along x
    (0.06 standardised units), learning Z must not lose to keeping it fixed. In shared
    coordinates Adam's steps (lr 0.05) carry Z out of the partitions (median ELBO −6.8 vs −2.5)."""
    rng = np.random.default_rng(0)
    X = rng.uniform(0, 20, size=(400, 1))
    y = np.sin(2 * np.pi * 0.6 * X[:, 0]) + 0.1 * rng.standard_normal(400)
    partition = partition_contiguous(X, 20)
    config = TrainConfig(steps=200, tol=None, seed=0)
    learned = fit_local((X, y, partition), LocalFitSpec(num_inducing=6), config)
    fixed = fit_local((X, y, partition), LocalFitSpec(num_inducing=6, learn_inducing=False),
                      config)
    learned_elbo = np.array([m.elbo for m in learned.modules.values()])
    fixed_elbo = np.array([m.elbo for m in fixed.modules.values()])
    assert np.median(learned_elbo) >= np.median(fixed_elbo) - 0.5
    assert (learned_elbo - fixed_elbo).min() > -2.0


def test_batched_fit_equals_separate_fits():
    rng = np.random.default_rng(0)
    X = rng.uniform(0, 3, size=(150, 1))
    y = np.sin(3 * X[:, 0]) + 0.1 * rng.standard_normal(150)
    partition = partition_contiguous(X, 3)
    spec = LocalFitSpec(num_inducing=6, inducing_init="grid", collapsed=False,
                        restarts=1)
    config = TrainConfig(steps=150, lr=0.03, tol=None, seed=1)
    batched = fit_local((X, y, partition), spec, config)
    for k in range(3):
        rows = partition.indices(k)
        alone_model = LocalGPs(
            torch.as_tensor(batched.standardisation.transform_x(X[rows])),
            torch.as_tensor(batched.standardisation.transform_y(y[rows])),
            partition_random(len(rows), 1, 0), 6, inducing_init="grid")
        train(alone_model, config=config)
        assert alone_model.elbo().item() == pytest.approx(
            batched.model.elbo()[k].item(), rel=1e-6)


def test_groups_with_different_numbers_of_inducing_inputs():
    rng = np.random.default_rng(1)
    X = rng.uniform(0, 4, size=(200, 1))
    y = np.sin(2 * X[:, 0]) + 0.1 * rng.standard_normal(200)
    partition = partition_contiguous(X, 4)
    fit = fit_local((X, y, partition), LocalFitSpec(num_inducing=[4, 9, 4, 9], collapsed=True),
                    TrainConfig(steps=100, tol=None))
    sizes = [m.num_inducing for m in fit.modules.values()]
    assert sizes == [4, 9, 4, 9]
    assert [m.info["partition"] for m in fit.modules.values()] == [0, 1, 2, 3]
    # Each module predicts its own partition far better than the constant mean.
    for k, module in enumerate(fit.modules.values()):
        rows = partition.indices(k)
        mean, _ = module.predict_y(X[rows])
        assert np.mean((mean.numpy() - y[rows]) ** 2) < 0.1 * np.var(y)


def test_random_labels_give_log_two():
    rng = np.random.default_rng(2)
    X = rng.uniform(size=(400, 1))
    y = (rng.uniform(size=400) < 0.5).astype(float)
    fit = fit_local((X, y, partition_random(400, 2, 0)),
                    LocalFitSpec(num_inducing=5, likelihood="bernoulli"),
                    TrainConfig(steps=200, lr=0.05))
    X_test = rng.uniform(size=(2000, 1))
    y_test = (rng.uniform(size=2000) < 0.5).astype(float)
    log_density = fit.modules["part000"].log_predictive(X_test, y_test)
    assert nlpd(log_density) == pytest.approx(math.log(2), abs=0.02)


def test_float32_fit_runs_and_matches_float64_roughly():
    rng = np.random.default_rng(3)
    X = rng.uniform(0, 5, size=(300, 1))
    y = np.sin(X[:, 0]) + 0.1 * rng.standard_normal(300)
    partition = partition_contiguous(X, 3)
    config = TrainConfig(steps=300, lr=0.05, tol=None)
    fits = {dtype: fit_local((X, y, partition), LocalFitSpec(num_inducing=6, dtype=dtype), config)
            for dtype in (torch.float32, torch.float64)}
    assert fits[torch.float32].modules["part000"].dtype == torch.float32
    e32 = np.array([m.elbo for m in fits[torch.float32].modules.values()])
    e64 = np.array([m.elbo for m in fits[torch.float64].modules.values()])
    assert np.allclose(e32, e64, rtol=1e-2)


def test_heteroscedastic_fit_learns_growing_noise():
    rng = np.random.default_rng(4)
    X = rng.uniform(0, 1, size=(600, 1))
    y = np.sin(6 * X[:, 0]) + (0.05 + 0.8 * X[:, 0]) * rng.standard_normal(600)
    fit = fit_local((X, y, partition_random(600, 1, 0)),
                    LocalFitSpec(num_inducing=8, likelihood="heteroscedastic"),
                    TrainConfig(steps=600, lr=0.05))
    module = fit.modules["part000"]
    assert module.num_latent == 2
    _, var_y = module.predict_y(np.array([[0.1], [0.9]]))
    true_sd = 0.05 + 0.8 * np.array([0.1, 0.9])
    assert var_y[1] > 10 * var_y[0]
    assert np.allclose(np.sqrt(var_y.numpy()), true_sd, rtol=0.5)


@pytest.mark.parametrize("link", ["softmax", "robustmax"])
def test_categorical_fit_separates_three_classes(link):
    rng = np.random.default_rng(5)
    labels = rng.integers(0, 3, size=300)
    X = np.stack([np.cos(2.1 * labels), np.sin(2.1 * labels)], 1) + 0.3 * rng.standard_normal(
        (300, 2))
    fit = fit_local((X, labels.astype(float), partition_random(300, 1, 0)),
                    LocalFitSpec(num_inducing=9, likelihood="categorical",
                                 likelihood_options={"num_classes": 3, "link": link}),
                    TrainConfig(steps=300, lr=0.05, tol=None))
    probs, _ = fit.modules["part000"].predict_y(X)
    assert probs.shape == (300, 3)
    assert (probs.argmax(-1).numpy() == labels).mean() > 0.9


def test_poisson_fit_recovers_the_rate():
    rng = np.random.default_rng(6)
    X = rng.uniform(0, 1, size=(500, 1))
    rate = np.exp(1.0 + np.sin(4 * X[:, 0]))
    y = rng.poisson(rate).astype(float)
    fit = fit_local((X, y, partition_random(500, 1, 0)),
                    LocalFitSpec(num_inducing=8, likelihood="poisson"),
                    TrainConfig(steps=400, lr=0.05))
    mean, _ = fit.modules["part000"].predict_y(np.array([[0.2], [0.5], [0.8]]))
    expected = np.exp(1.0 + np.sin(4 * np.array([0.2, 0.5, 0.8])))
    assert np.allclose(mean.numpy(), expected, rtol=0.2)


@pytest.mark.parametrize("likelihood", ["bernoulli", "poisson"])
def test_an_exact_non_gaussian_bound_trains_by_lbfgs_to_adams_optimum(likelihood):
    """Full batch with an expectation by quadrature (Bernoulli) or in closed form (Poisson):
    the default trains every parameter, q(u) included, by the batched L-BFGS, converges, and
    ends where natural-gradient steps with Adam end when run long (every partition's ELBO within
    0.05 nats). The categorical (a Monte Carlo softmax, a robustmax that is not smooth) keeps
    Adam, with natural-gradient steps on q(u) for the robustmax only (a softmax's step would be
    judged by two estimates with different draws)."""
    rng = np.random.default_rng(8)
    X = rng.uniform(0, 1, size=(200, 1))
    latent = 2.0 * np.sin(6 * X[:, 0])
    y = (rng.uniform(size=200) < 1 / (1 + np.exp(-latent))).astype(float) \
        if likelihood == "bernoulli" else rng.poisson(np.exp(1 + latent / 2)).astype(float)
    spec = LocalFitSpec(num_inducing=8, likelihood=likelihood, restarts=1)
    config = default_config(spec)
    assert (config.optimizer, config.natural_gradient_lr) == ("lbfgs", None)
    for link, natural_gradient_lr in (("softmax", None), ("robustmax", 1.0)):
        categorical = default_config(replace(spec, likelihood="categorical",
                                             likelihood_options={"link": link}))
        assert (categorical.optimizer, categorical.natural_gradient_lr) == ("adam",
                                                                           natural_gradient_lr)
    partition = partition_random(200, 2, 0)
    fit = fit_local((X, y, partition), spec)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NotConvergedWarning)
        adam = fit_local((X, y, partition), spec, replace(UNCOLLAPSED_CONFIG, steps=3000))
    assert fit.result.converged
    for name, module in fit.modules.items():
        assert module.elbo == pytest.approx(adam.modules[name].elbo, abs=0.05)


def test_by_default_a_partition_takes_half_its_rows_as_inducing_inputs_at_most_100():
    """M_k = min(⌈N_k/2⌉, 100) without ``num_inducing`` (partitions of 61 and 250 points: 31
    and 100), and every Z moves: no default module stores its partition's inputs as Z."""
    rng = np.random.default_rng(7)
    X = rng.uniform(0, 6, size=(311, 1))
    y = np.sin(2 * X[:, 0]) + 0.1 * rng.standard_normal(311)
    partition = Partition(np.repeat([0, 1], [61, 250]), {"kind": "random", "num_partitions": 2})
    fit = fit_local((X, y, partition), LocalFitSpec(restarts=1), TrainConfig(steps=2))
    assert [m.num_inducing for m in fit.modules.values()] == [31, 100]
    assert all(any("inducing" in name for name, _ in group.named_parameters())
               for group in fit.model.groups)


def test_a_partition_with_as_many_inducing_inputs_as_points_fits_the_exact_gp():
    """M_k = N_k: Z stays at the partition's own inputs and the collapsed bound is the exact log
    marginal likelihood log N(y | 0, K + σ²I) at the fitted hyperparameters; the partition
    beside it (M_k < N_k) still moves its Z."""
    rng = np.random.default_rng(6)
    X = np.sort(rng.uniform(0, 6, size=(50, 1)), 0)
    y = np.sin(2 * X[:, 0]) + 0.1 * rng.standard_normal(50)
    partition = partition_contiguous(X, 2)
    whole = int(partition.sizes[0])
    spec = LocalFitSpec(num_inducing=[whole, 6], collapsed=True)
    fit = fit_local((X, y, partition), spec,
                    TrainConfig(optimizer="lbfgs", lr=1.0, steps=200, window=10, tol=1e-9))
    by_partition = {int(k): (group, slot) for group, members in
                    zip(fit.model.groups, fit.model.group_members, strict=True)
                    for slot, k in enumerate(members.tolist())}
    group, slot = by_partition[0]
    Xk, yk = group.data_X[slot], group.data_y[slot]
    assert torch.allclose(group.inducing[slot], Xk, rtol=0, atol=1e-12)
    K = group.kernel(Xk.expand(*group.kernel.batch_shape, *Xk.shape))[slot, 0]
    noise = group.likelihood.variance[slot]
    exact = torch.distributions.MultivariateNormal(
        torch.zeros_like(yk), K + noise * torch.eye(whole, dtype=K.dtype)).log_prob(yk)
    group.layer.jitter = 1e-12  # the fit's relative jitter (1e-6) alone moves the bound by ~1e-4
    bound = collapsed_bound(group, group.data_X, group.data_y, group.data_mask)[slot]
    assert bound.item() == pytest.approx(exact.item(), rel=1e-7)
    learned = [{name for name, _ in g.named_parameters() if "inducing" in name}
               for g in (group, by_partition[1][0])]
    assert learned[0] == set() and learned[1] != set()
