"""The ELBO of the multitask models (Boustati et al., eq. 9) and its doubly-stochastic estimator:
identities that pin the maths (spec Sec. 4.2, T3–T6, T8, T11).

- T3: one layer, Z = X and the optimal q: the iGP ELBO is every task's exact log marginal
  likelihood, and any other q gives less;
- T4: iGP = the library's batched SVGPs task by task; iGP and cGP = GPyTorch's
  IndependentMultitask / LMC variational strategies on the same parameters;
- T5: mMDGP with I = 0 = Σ of single-task iDGPs; sMDGP with T = 1 = a DS-DGP ELBO written out
  here; a near-deterministic identity inner layer gives the SVGP ELBO on x;
- T6: the estimator is unbiased (against Gauss–Hermite quadrature over a 1-D latent space; S = 1
  against S = 100; Monte Carlo f against the analytic Gaussian expectation), and scaled
  minibatches partitioning the data average to the full ELBO exactly (stacked and stratified);
  the random minibatches weigh every row by 1 on average;
- T8: an empty task contributes only its KL; absent tasks, shapes, list = long format;
- T11: the prior makes tasks uncorrelated but dependent.
"""

import math

import numpy as np
import pytest
import torch
from pyrogp_models.inference.natural_gradient import NaturalGradient
from torch.distributions import MultivariateNormal, kl_divergence

from multitask_helpers import randomise, toy_data, toy_model
from pyrogp_models.kernels import Stationary
from pyrogp_models.likelihoods import make_likelihood
from pyrogp_models.models.local.svgp import BatchedSVGP
from pyrogp_models.models.multitask import (
    IDGP,
    IGP,
    Initialisation,
    MultitaskOptions,
    MultitaskPredictor,
    TaskBatch,
    TaskData,
    TaskLayout,
    TaskStandardisation,
    build_model,
    components,
    toy_tasks,
    weighted_batch,
)


def per_row_noise(model, num_samples=3, seed=5):
    """Fixed standard normal draws per data row [S, N, W] (common random numbers)."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(num_samples, model.data_X.shape[0], model.latent.noise_width,
                       generator=generator)


# T3 -------------------------------------------------------------------------------------------
def test_igp_with_optimal_q_at_the_data_is_the_exact_log_marginal_likelihood():
    data, _ = toy_data(12)
    layout = TaskLayout.of(data.task, 2)
    X = layout.gather(data.X, 1)                                     # [T, N, 1], equal N^t
    init = Initialisation(X.clone(), X[0].clone(), torch.eye(1), torch.Generator().manual_seed(0))
    model = randomise(IGP(MultitaskOptions(num_inducing=12, jitter=1e-9), init, data))
    layer, noise = model.top.layer, model.likelihood.variance
    y = layout.gather(data.y)
    with torch.no_grad():
        A = layer.projection(X.unsqueeze(-3)).squeeze(-3)            # [T, M, N]
        precision = torch.eye(12) + A @ A.mT / noise[:, None, None]
        covariance = torch.cholesky_inverse(torch.linalg.cholesky(precision))
        mean = covariance @ (A @ y.unsqueeze(-1)).squeeze(-1).unsqueeze(-1) / noise[:, None, None]
        layer.set_whitened_posterior(mean.squeeze(-1).unsqueeze(1),
                                     torch.linalg.cholesky(covariance).unsqueeze(1))
        gram = layer.kernel(X.unsqueeze(1), X.unsqueeze(1)).squeeze(1)
        exact = torch.distributions.MultivariateNormal(
            torch.zeros(12), gram + noise[:, None, None] * torch.eye(12)).log_prob(y).sum()
        assert abs(float(model.elbo() - exact)) < 1e-6 * 24
        layer.set_whitened_posterior(layer.q_mean + 0.1, layer.q_sqrt)
        assert float(model.elbo()) < float(exact) - 1e-3


def test_single_layer_models_with_every_input_inducing_keep_them_fixed_and_are_the_exact_gp():
    """Where M covers the distinct inputs (the default when the largest task has them all),
    k-means puts a centre on each: iGP and the LMC cGP are then the exact GP — at the optimal
    q (one unit natural-gradient step) the ELBO is the exact log marginal likelihood of the
    heterotopic data — and their inducing inputs stay fixed (in float32 too); with one fewer
    they are learned."""
    x = torch.linspace(-1.5, 1.5, 10, dtype=torch.float64)[:, None]
    X = torch.cat([x, x[:7]])
    task = torch.cat([torch.zeros(10), torch.ones(7)]).long()
    y = torch.cat([torch.sin(3 * x[:, 0]), torch.cos(2 * x[:7, 0])])
    data = TaskData.from_long(X, task, y, 2)
    for kind in ("igp", "cgp"):
        model = randomise(build_model(kind, data, MultitaskOptions(jitter=1e-10)))
        layer = model.top.layer
        assert model.options.learn_inducing is False
        assert "inducing_unit" in dict(layer.named_buffers())
        NaturalGradient(model, 1.0)(lambda model=model: -model.elbo())
        with torch.no_grad():
            gram = layer.kernel(X[None, None], X[None, None])[:, 0]           # [B, N, N]
            if kind == "igp":
                covariance = gram[task, torch.arange(17)] * (task[:, None] == task[None, :])
            else:
                mixing = model.top.mixing[task]                                   # [N, R]
                covariance = torch.einsum("nr,mr,rnm->nm", mixing, mixing,
                                          gram.expand(mixing.shape[1], -1, -1))
            covariance = covariance + torch.diag(model.likelihood.variance[task])
            exact = MultivariateNormal(torch.zeros(17, dtype=X.dtype), covariance).log_prob(y)
            assert float(model.elbo()) == pytest.approx(float(exact), abs=1e-6)
        single = TaskData.from_long(X, task, y, 2, dtype=torch.float32)
        assert build_model(kind, single).options.learn_inducing is False      # float32 too
        fewer = build_model(kind, data, MultitaskOptions(num_inducing=9))
        assert fewer.options.learn_inducing is True
        assert "inducing_unit_unconstrained" in dict(fewer.top.layer.named_parameters())


# T4 -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("likelihood", ["gaussian", "bernoulli"])
def test_igp_is_one_library_svgp_per_task(likelihood):
    igp = randomise(toy_model("igp", gap=(0.3, 0.6), likelihood=likelihood))
    layout = igp.data_layout()
    layer = igp.top.layer
    kernel = make_kernel_like(layer.kernel)
    lik = make_likelihood(likelihood, (2,), **(
        {"variance": igp.likelihood.variance.detach()} if likelihood == "gaussian" else {}))
    svgp = BatchedSVGP(layer.inducing.squeeze(1).detach(), kernel, lik,
                       layout.gather(igp.data_X, 1), layout.gather(igp.data_y), layout.mask)
    svgp.layer.set_whitened_posterior(layer.q_mean.detach(), layer.q_sqrt.detach())
    assert torch.allclose(igp.task_elbos(), svgp.elbo(), rtol=1e-10, atol=0)


def make_kernel_like(kernel):
    return Stationary(kernel.family, kernel.input_dim, tuple(kernel.batch_shape), ard=kernel.ard,
                      lengthscale=kernel.lengthscale.detach(), variance=kernel.variance.detach())


def gpytorch_elbo(model, coregionalised: bool):
    """GPyTorch's ELBO (VariationalELBO × N) of a model with the same whitened q, Z, kernels
    and (one) noise variance as ``model``: IndependentMultitaskVariationalStrategy for iGP,
    LMCVariationalStrategy for cGP, both evaluating every row at its own task only. GPyTorch adds
    its K_zz jitter ε to k(x, x) of every latent GP too, lowering the Gaussian data term by
    Σ_n Σ_r W²_{t_n r} ε/(2σ²) (W = I for iGP): that is added back."""
    gpytorch = pytest.importorskip("gpytorch")
    layer = model.top.layer
    Z = layer.inducing.squeeze(1).detach()                           # [B, M, D]
    batch = torch.Size([Z.shape[0]])
    variance = layer.kernel.variance.detach().reshape(-1)

    class Reference(gpytorch.models.ApproximateGP):
        def __init__(self):
            distribution = gpytorch.variational.CholeskyVariationalDistribution(
                Z.shape[-2], batch_shape=batch)
            base = gpytorch.variational.VariationalStrategy(
                self, Z, distribution, learn_inducing_locations=True,
                jitter_val=model.options.jitter * float(variance[0]))
            strategy = (gpytorch.variational.LMCVariationalStrategy(
                base, model.num_tasks, num_latents=batch[0], latent_dim=-1, jitter_val=0.0)
                if coregionalised else gpytorch.variational.IndependentMultitaskVariationalStrategy(
                    base, model.num_tasks))
            super().__init__(strategy)
            self.mean_module = gpytorch.means.ZeroMean(batch_shape=batch)
            self.covar_module = gpytorch.kernels.ScaleKernel(gpytorch.kernels.MaternKernel(
                nu=2.5, ard_num_dims=Z.shape[-1], batch_shape=batch), batch_shape=batch)

        def forward(self, x):
            return gpytorch.distributions.MultivariateNormal(self.mean_module(x),
                                                             self.covar_module(x))

    reference = Reference().double()
    with torch.no_grad():
        distribution = reference.variational_strategy.base_variational_strategy
        distribution._variational_distribution.variational_mean.copy_(layer.q_mean.squeeze(1))
        chol = layer.q_sqrt if layer.covariance == "meanfield" else diagonal_blocks(layer)
        distribution._variational_distribution.chol_variational_covar.copy_(chol.squeeze(1))
        distribution.variational_params_initialized.fill_(1)
        reference.covar_module.base_kernel.lengthscale = layer.kernel.lengthscale.detach() \
            .expand(*batch, 1, -1)
        reference.covar_module.outputscale = variance.expand(batch)
        if coregionalised:
            reference.variational_strategy.lmc_coefficients.copy_(model.top.mixing.mT)
    likelihood = gpytorch.likelihoods.GaussianLikelihood().double()
    likelihood.noise = model.likelihood.variance.detach()[0]
    elbo = gpytorch.mlls.VariationalELBO(likelihood, reference, num_data=len(model.data_y))
    output = reference(model.data_X, task_indices=model.data_task)
    loadings = (model.top.mixing.square().sum(-1)[model.data_task].sum() if coregionalised
                else len(model.data_y))
    jitter_term = float(loadings) * distribution.jitter_val / (2 * float(likelihood.noise.detach()))
    return float(elbo(output, model.data_y)) * len(model.data_y) + jitter_term


def diagonal_blocks(layer) -> torch.Tensor:
    """The [R, 1, M, M] diagonal blocks of a joint q_sqrt [R·M, R·M]."""
    size = layer.num_inducing
    return torch.stack([layer.q_sqrt[r * size:(r + 1) * size, r * size:(r + 1) * size]
                        for r in range(layer.q_mean.shape[0])]).unsqueeze(1)


@pytest.mark.parametrize("kind", ["igp", "cgp"])
def test_igp_and_cgp_match_gpytorch_multitask_strategies(kind):
    """cGP's joint q is made block-diagonal: GPyTorch's LMC has a q per latent GP."""
    model = randomise(toy_model(kind, gap=(0.3, 0.6), coregionalisation="lmc",
                                top_variance=1.3))
    with torch.no_grad():
        if model.top.layer.covariance == "joint":
            model.top.layer.q_sqrt = torch.block_diag(*diagonal_blocks(model.top.layer)[:, 0])
        model.likelihood.variance = torch.full((2,), 0.07)            # one noise, as GPyTorch's
        model.top.layer.kernel.lengthscale = torch.rand(
            model.top.layer.kernel.lengthscale.shape, generator=torch.Generator().manual_seed(3)
        ) + 0.5
    assert float(model.elbo()) == pytest.approx(gpytorch_elbo(model, kind == "cgp"), rel=1e-8)


# T5 -------------------------------------------------------------------------------------------
def test_mmdgp_without_shared_processes_is_the_sum_of_single_task_idgps():
    big = randomise(toy_model("mmdgp", gap=(0.3, 0.6), num_shared=0, private_width=2,
                              q_scale=0.3))
    noise = per_row_noise(big)
    state = big.state_dict()
    total = 0.0
    for task in range(2):
        rows = torch.nonzero(big.data_task == task).squeeze(-1)
        data = TaskData(big.data_X[rows], torch.zeros_like(rows), big.data_y[rows], 1)
        small = IDGP(big.options, Initialisation.from_data(data, 5), data)
        small.load_state_dict({key: value if value.shape == state[key].shape
                               else state[key][task:task + 1]
                               for key, value in small.state_dict().items()})
        total = total + small.elbo(noise=noise[:, rows])
    assert float(big.elbo(noise=noise)) == pytest.approx(float(total), rel=1e-10)


def matern52(X, Z, lengthscale, variance):
    r = torch.cdist(X / lengthscale, Z / lengthscale)
    return variance * (1 + math.sqrt(5) * r + 5 / 3 * r**2) * torch.exp(-math.sqrt(5) * r)


def sparse_gp(X, Z, lengthscale, variance, q_mean, q_sqrt, jitter):
    """Marginal means and variances [N, W] of a whitened SVGP with W outputs (one kernel, one
    Z), and its KL, written out output by output."""
    gram = matern52(Z, Z, lengthscale, variance) + jitter * variance * torch.eye(len(Z))
    A = torch.linalg.solve_triangular(torch.linalg.cholesky(gram),
                                      matern52(Z, X, lengthscale, variance), upper=False)
    means, variances, kl = [], [], 0.0
    for m, L in zip(q_mean, q_sqrt, strict=True):
        means.append(A.T @ m)
        variances.append(variance - (A**2).sum(0) + ((L.T @ A) ** 2).sum(0))
        kl = kl + 0.5 * ((L**2).sum() + m @ m - len(m) - 2 * L.diagonal().log().sum())
    return torch.stack(means, -1), torch.stack(variances, -1), kl


def test_smdgp_with_one_task_is_the_doubly_stochastic_dgp_elbo():
    data, _ = toy_data(15)
    rows = torch.nonzero(data.task == 0).squeeze(-1)
    one = TaskData(torch.cat([data.X[rows], data.X[rows] ** 2], -1), torch.zeros_like(rows),
                   data.y[rows], 1)
    model = randomise(build_model("smdgp", one, MultitaskOptions(num_inducing=6, shared_width=3,
                                                                 inner_ard=True)))
    noise = per_row_noise(model, num_samples=4)
    shared, top = model.latent.shared.layer, model.top.layer

    def parameters(layer):
        return (layer.inducing.reshape(-1, layer.inducing.shape[-1]),
                layer.kernel.lengthscale.reshape(-1), layer.kernel.variance.reshape(()),
                layer.q_mean.reshape(-1, layer.num_inducing),
                layer.q_sqrt.reshape(-1, layer.num_inducing, layer.num_inducing))

    with torch.no_grad():
        jitter = model.options.jitter
        mean, var, kl_inner = sparse_gp(one.X, *parameters(shared), jitter)
        mean = mean + one.X @ model.latent.shared.mean_weights
        noise_variance = model.likelihood.variance[0]
        expected = 0.0
        for draw in noise:
            latent = mean + (var + model.options.inner_noise).sqrt() * draw
            f_mean, f_var, kl_top = sparse_gp(latent, *parameters(top), jitter)
            f_mean, f_var = f_mean.squeeze(-1), f_var.squeeze(-1)
            expected = expected + (-0.5 * torch.log(2 * math.pi * noise_variance)
                                   - 0.5 * ((one.y - f_mean) ** 2 + f_var)
                                   / noise_variance).sum() / len(noise)
        reference = expected - kl_inner - kl_top
        assert float(model.elbo(noise=noise)) == pytest.approx(float(reference), rel=1e-10)


def test_a_deterministic_identity_inner_layer_gives_the_svgp_elbo_on_x():
    options = dict(shared_variance=1e-12, inner_noise=0.0, q_scale=1.0, gap=(0.3, 0.6))
    deep, shallow = toy_model("smdgp", shared_width=1, **options), toy_model("igp", **options)
    randomise(shallow)
    deep.load_state_dict({**deep.state_dict(), **{
        key: value for key, value in shallow.state_dict().items()
        if key.startswith(("top.", "likelihood."))}})
    assert float(deep.latent.kl()) == 0.0
    elbo = deep.elbo(noise=per_row_noise(deep))
    assert float(elbo) == pytest.approx(float(shallow.elbo()), rel=1e-5)


# T6 -------------------------------------------------------------------------------------------
def sample_estimates(model, noise):
    """The single-draw data-term estimates [S] on all rows for draws noise [S, T, P, W]."""
    batch = model.full_batch()
    with torch.no_grad():
        _, mean, var = model.output_moments(model.data_X[batch.rows], noise)
        expected = model.likelihood.expected_log_prob(model.data_y[batch.rows], mean, var)
    return (expected * batch.weights).sum((-2, -1))


def test_the_estimator_is_unbiased():
    model = randomise(toy_model("smdgp", shared_width=1, q_scale=0.5), scale=0.6)
    shape = model.full_batch().rows.shape
    generator = torch.Generator().manual_seed(0)
    nodes, weights = np.polynomial.hermite.hermgauss(80)
    nodes = torch.as_tensor(nodes * math.sqrt(2)).reshape(-1, 1, 1, 1).expand(-1, *shape, 1)
    exact = (sample_estimates(model, nodes) * torch.as_tensor(weights / math.sqrt(math.pi))).sum()
    single = sample_estimates(model, model.draw_noise(20000, shape, nodes, generator))
    averaged = sample_estimates(model, model.draw_noise(20000, shape, nodes, generator)
                                ).reshape(200, 100).mean(-1)
    se_single, se_averaged = single.std() / math.sqrt(20000), averaged.std() / math.sqrt(200)
    assert abs(float(single.mean() - exact)) < 3 * float(se_single)
    assert abs(float(single.mean() - averaged.mean())) < 3 * float(
        (se_single**2 + se_averaged**2).sqrt())


def test_monte_carlo_variational_expectation_of_one_layer_matches_the_closed_form():
    model = randomise(toy_model("igp"))
    batch = model.full_batch()
    y = model.data_y[batch.rows]
    with torch.no_grad():
        _, mean, var = model.output_moments(model.data_X[batch.rows], None)
        f = mean + var.sqrt() * torch.randn(20000, *mean.shape[1:])
        noise = model.likelihood.variance[:, None]
        draws = (torch.distributions.Normal(f, noise.sqrt()).log_prob(y) * batch.weights
                 ).sum((-2, -1))
        exact = model.data_terms(batch).sum()
    assert abs(float(draws.mean() - exact)) < 3 * float(draws.std() / math.sqrt(20000))


@pytest.mark.parametrize("scheme", ["stacked", "stratified"])
def test_scaled_minibatches_partitioning_the_data_average_to_the_full_elbo(scheme):
    model = randomise(build_model("mmdgp", uneven_tasks((24, 12)), MultitaskOptions(
        num_inducing=5, q_scale=0.3)))
    noise, task = per_row_noise(model), model.data_task
    counts, parts = torch.bincount(task), 3
    generator = torch.Generator().manual_seed(2)
    if scheme == "stacked":
        chunks = torch.randperm(len(task), generator=generator).chunk(parts)
    else:
        per_task = [torch.nonzero(task == t).squeeze(-1) for t in range(2)]
        assert all(len(rows) % parts == 0 for rows in per_task)
        chunks = [torch.cat(group) for group in zip(*[rows[torch.randperm(
            len(rows), generator=generator)].chunk(parts) for rows in per_task], strict=True)]
    elbos = []
    for rows in chunks:
        scale = (len(task) / len(rows) if scheme == "stacked" else
                 counts[task[rows]] / torch.bincount(task[rows], minlength=2)[task[rows]])
        weights = torch.as_tensor(scale, dtype=torch.float64).expand(len(rows))
        elbos.append(model.elbo(weighted_batch(task, rows, weights, 2), noise))
    full = model.elbo(noise=noise)
    assert float(torch.stack(elbos).mean()) == pytest.approx(float(full), rel=1e-10)


@pytest.mark.parametrize("scheme", ["stacked", "stratified"])
def test_random_minibatches_weigh_every_row_by_one_on_average(scheme):
    model = toy_model("igp", gap=(0.3, 0.6), batch_size=8, minibatch=scheme)
    draws = 4000
    totals = torch.zeros(draws, len(model.data_y))
    for draw in range(draws):
        batch = model.draw_batch()
        totals[draw].index_put_((batch.rows.flatten(),), batch.weights.flatten(),
                                accumulate=True)
    mean, se = totals.mean(0), totals.std(0) / math.sqrt(draws)
    assert bool(((mean - 1).abs() < 4 * se).all())


# T8 -------------------------------------------------------------------------------------------
def uneven_tasks(counts=(37, 0, 12), seed=0) -> TaskData:
    generator = torch.Generator().manual_seed(seed)
    X = torch.rand(sum(counts), 2, generator=generator)
    task = torch.repeat_interleave(torch.arange(len(counts)), torch.as_tensor(counts))
    return TaskData(X, task, torch.sin(3 * X[:, 0]) + task, len(counts))


def test_sample_shapes_with_an_empty_task():
    data = uneven_tasks()
    model = build_model("mmdgp", data, MultitaskOptions(num_inducing=5, shared_width=2,
                                                        private_width=3))
    assert data.counts.tolist() == [37, 0, 12]
    parts = components(model, data.X, data.task, num_samples=4)
    layers = model.latent.parts(parts.layout.to_long(parts.latent, 1))
    f = parts.layout.to_long(parts.mean)
    assert layers["shared"].shape == (4, 49, 2)
    for task, count in enumerate((37, 0, 12)):
        assert layers["private"][:, data.task == task].shape == (4, count, 3)
        assert f[:, data.task == task].shape == (4, count)
    predictor = MultitaskPredictor(model, TaskStandardisation.from_data(data), num_samples=10)
    mean, var = predictor.predict_tasks(torch.rand(7, 2))
    assert mean.shape == var.shape == (3, 7) and bool(torch.isfinite(mean).all())


def test_an_empty_task_contributes_only_its_kl():
    model = randomise(build_model("mmdgp", uneven_tasks(), MultitaskOptions(num_inducing=5)))
    top = model.top.layer
    parameters = [top.q_mean_unconstrained, top.q_sqrt_unconstrained]
    data_grads = torch.autograd.grad(model.data_terms().sum(), parameters)
    elbo_grads = torch.autograd.grad(model.elbo(), parameters)
    kl_grads = torch.autograd.grad(-model.kl(), parameters)
    for data_grad, elbo_grad, kl_grad in zip(data_grads, elbo_grads, kl_grads, strict=True):
        assert bool((data_grad[1] == 0).all()) and bool((data_grad[0] != 0).any())
        assert torch.equal(elbo_grad[1], kl_grad[1])


def test_a_batch_without_some_tasks_gives_a_finite_elbo():
    model = build_model("mmdgp", uneven_tasks(), MultitaskOptions(num_inducing=5))
    rows = torch.arange(5)                                           # task 0 only
    batch = weighted_batch(model.data_task, rows, torch.full((5,), 49 / 5), 3)
    elbo = model.elbo(batch)
    assert math.isfinite(float(elbo))
    assert float(elbo) != float(model.elbo())


def test_long_and_list_formats_give_the_same_elbo():
    data, _ = toy_data(12, gap=(0.4, 0.6))
    order = torch.randperm(len(data.y), generator=torch.Generator().manual_seed(0))
    pairs = [(data.X[data.task == t], data.y[data.task == t]) for t in range(2)]
    from_list = TaskData.from_list(pairs)
    from_long = TaskData.from_long(data.X[order], data.task[order], data.y[order])
    options = MultitaskOptions(num_inducing=5)
    init = Initialisation.from_data(from_list, 5)
    list_model = randomise(build_model("mmdgp", from_list, options))
    long_model = type(list_model)(options, init, from_long)
    long_model.load_state_dict(list_model.state_dict())
    noise = per_row_noise(list_model)                                # list row = data row
    assert float(long_model.elbo(noise=noise[:, order])) == pytest.approx(
        float(list_model.elbo(noise=noise)), rel=1e-12)


@pytest.mark.parametrize("kind", ["smdgp", "mmdgp", "idgp", "cmdgp"])
def test_shared_processes_once_per_distinct_input_give_the_same_elbo_and_gradients(kind):
    """Where tasks share inputs, the full batch evaluates shared processes at the distinct
    inputs only; the ELBO and its gradients are those of every slot evaluated."""
    pairs = toy_tasks(15, seed=3)
    X = pairs[0][0]
    data = TaskData.from_list([(X, pairs[0][1]), (X, 2 * pairs[0][1] + 1),
                               (X[:6], pairs[1][1][:6])])
    model = randomise(build_model(kind, data, MultitaskOptions(num_inducing=5)))
    for _, block in model.latent.blocks():      # inner processes that matter
        block.layer.kernel.variance = torch.ones_like(block.layer.kernel.variance)
    full = model.full_batch()
    assert model.distinct_inputs(full).X.shape[0] == len(X) < full.rows.numel()
    noise = per_row_noise(model)
    values = []
    for batch in (full, TaskBatch(full.rows, full.weights)):     # the same rows, slot by slot
        model.zero_grad()
        elbo = model.elbo(batch, noise)
        elbo.backward()
        values.append((elbo.detach(), [p.grad.clone() for p in model.parameters()
                                       if p.grad is not None]))
    torch.testing.assert_close(values[0][0], values[1][0], rtol=1e-12, atol=0.0)
    for first, second in zip(values[0][1], values[1][1], strict=True):
        torch.testing.assert_close(first, second, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("noise", ["independent", "correlated"])
def test_cgp_latent_gps_once_per_distinct_input_give_the_same_bound_and_gradients(noise):
    """cGP's collapsed bound (independent noise: its features per row; correlated: its
    whitened site rows) from its latent GPs at the distinct inputs equals the bound from every
    slot evaluated, and so do its gradients."""
    pairs = toy_tasks(15, seed=3)
    X = pairs[0][0]
    data = TaskData.from_list([(X, pairs[0][1]), (X, np.sin(2 * pairs[0][1] + 1)),
                               (X[:6], pairs[1][1][:6])])
    model = randomise(build_model("cgp", data, MultitaskOptions(num_inducing=5, noise=noise)))
    assert model.distinct_inputs(model.full_batch()).X.shape[0] == len(X)
    values = []
    for distinct in (model.data_distinct_X, None):                  # then slot by slot
        model.data_distinct_X = distinct
        model.zero_grad()
        bound = model.collapsed_bound()
        bound.backward()
        values.append((bound.detach(), [p.grad.clone() for p in model.parameters()
                                        if p.grad is not None]))
    torch.testing.assert_close(values[0][0], values[1][0], rtol=1e-12, atol=0.0)
    assert len(values[0][1]) == len(values[1][1]) > 0
    for first, second in zip(values[0][1], values[1][1], strict=True):
        torch.testing.assert_close(first, second, rtol=1e-10, atol=1e-12)


# The KL terms and the initialisation ------------------------------------------------------------
@pytest.mark.parametrize("kind", ["mmdgp", "cmdgp", "cgp"])
def test_the_kl_is_the_sum_of_every_layers_whitened_kl(kind):
    model = randomise(toy_model(kind))
    def kl(layer):
        mean = layer.q_mean if layer.covariance == "meanfield" else layer.q_mean.reshape(-1)
        return kl_divergence(MultivariateNormal(mean, scale_tril=layer.q_sqrt),
                             MultivariateNormal(torch.zeros_like(mean), scale_tril=torch.eye(
                                 layer.q_sqrt.shape[-1]))).sum()
    expected = sum(kl(layer) for _, layer in model.variational_sites())
    assert float(model.kl()) == pytest.approx(float(expected), rel=1e-10)


def test_the_initialisation_follows_the_spec():
    data = uneven_tasks((30, 25, 20))
    model = build_model("mmdgp", TaskData(torch.cat([data.X, data.X.sum(-1, keepdim=True)], -1),
                                          data.task, data.y, 3),
                        MultitaskOptions(num_inducing=6, inner_width=2))
    shared, private = model.latent.shared, model.latent.private
    assert (shared.width, private.width) == (2, 2)                  # W = 2 each
    assert shared.layer.num_inducing == 6 and private.layer.num_inducing == 6   # M and M
    assert torch.allclose(shared.layer.q_sqrt, torch.eye(6), rtol=1e-12, atol=0)   # the prior
    assert torch.allclose(model.top.layer.q_sqrt, torch.eye(6), rtol=1e-12, atol=0)
    assert float(private.layer.kernel.variance[0, 0]) != float(shared.layer.kernel.variance[0])
    centred = model.data_X - model.data_X.mean(0)                    # D = 3 > W: PCA mean
    first = torch.linalg.svd(centred).Vh[:2]
    assert torch.allclose((shared.mean_weights.mT @ first.mT).abs(), torch.eye(2), atol=1e-10)
    top_inducing = model.top.layer.inducing.squeeze(1)              # Z^t pushed through m
    own = private.layer.inducing[:, 0, 0]
    assert torch.allclose(top_inducing, torch.cat([own @ shared.mean_weights,
                                                   own @ private.mean_weights], -1))
    with pytest.raises(ValueError, match="smdgp cannot have"):
        build_model("smdgp", data, MultitaskOptions(num_private=1))


# T11 ------------------------------------------------------------------------------------------
def test_prior_tasks_are_uncorrelated_but_dependent():
    model = toy_model("mmdgp", shared_variance=1.0, private_variance=0.1, top_lengthscale=1.0,
                      top_mean="zero")
    with torch.no_grad():
        for _, layer in model.variational_sites():                  # q(v) = p(v): prior draws
            layer.set_whitened_posterior(torch.zeros_like(layer.q_mean),
                                         torch.eye(layer.num_inducing).expand_as(layer.q_sqrt))
        X = torch.tensor([[0.0], [0.7]]).unsqueeze(0)                # [1, 2 points, 1]
        draws = 100_000
        generator = torch.Generator().manual_seed(0)
        latent = model.latent_draws(X, model.draw_noise(draws, (2, 2), X, generator,
                                                        tie_shared=True))
        mean, cov = model.top.layer.marginals(latent.unsqueeze(-3), full_cov=True)
        chol = torch.linalg.cholesky(cov + 1e-10 * torch.eye(2))
        f = (mean + (chol @ torch.randn(*mean.shape, 1, generator=generator)).squeeze(-1)
             ).squeeze(-2)                                            # [S, T, 2]

    def corr(a, b):
        return float(torch.corrcoef(torch.stack([a, b]))[0, 1])

    assert abs(corr(f[:, 0, 0], f[:, 1, 0])) < 0.02
    increments = (f[:, :, 0] - f[:, :, 1]).square()
    assert corr(increments[:, 0], increments[:, 1]) * math.sqrt(draws) > 5
    with_mean = f + latent.sum(-1)                                   # a linear top-layer mean
    assert corr(with_mean[:, 0, 0], with_mean[:, 1, 0]) > 0.1
