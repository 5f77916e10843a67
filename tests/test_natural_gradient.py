"""Natural-gradient steps on q(u): exact identities for a Gaussian likelihood, convergence for a
Bernoulli one, batching, and the trainer / command-line option."""

import numpy as np
import pytest
import torch
from pyro.infer import TraceMeanField_ELBO
from pyrogp_models.inference.cli import main
from pyrogp_models.inference.local_fit import LocalFitSpec, fit_local
from pyrogp_models.inference.natural_gradient import (
    NaturalGradient,
    covariance_gradient,
    natural_update,
)
from pyrogp_models.inference.recycling import RecycleSpec, recycle
from pyrogp_models.inference.trainer import TrainConfig, train

from pyrogp_models.data.partitioners import Partition
from pyrogp_models.models.local.collapsed import collapsed_bound
from pyrogp_models.models.local.local_gps import LocalGPs
from pyrogp_models.modules.stack import ModuleStack

SIZES = (9, 14, 21)  # unequal partitions: padding and masks


def data(likelihood: str, sizes=SIZES, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    x = torch.rand(sum(sizes), 1, generator=generator) * 6.0
    f = torch.sin(2.0 * x[:, 0])
    if likelihood == "gaussian":
        y = f + 0.2 * torch.randn(len(x), generator=generator)
    elif likelihood == "bernoulli":
        y = (torch.rand(len(x), generator=generator) < torch.sigmoid(3.0 * f)).double()
    else:
        y = (torch.bucketize(f + 0.3 * torch.randn(len(x), generator=generator),
                             torch.tensor([-0.4, 0.4]))).double()
    labels = np.repeat(np.arange(len(sizes)), sizes)
    return x, y, Partition(labels, {"kind": "random", "num_partitions": len(sizes)})


def options(likelihood: str) -> dict:
    return {"num_classes": 3, "link": "robustmax"} if likelihood == "categorical" else {}


def local_model(likelihood: str, num_inducing=(4, 6, 4), sizes=SIZES, inducing=None):
    x, y, partition = data(likelihood, sizes)
    return LocalGPs(x, y, partition, list(num_inducing), likelihood, options(likelihood),
                    inducing_init="grid", inducing=inducing)


def loss_fn(model):
    elbo = TraceMeanField_ELBO()
    return lambda: elbo.differentiable_loss(model.model, model.guide)


def perturb_q(model, seed: int = 1) -> None:
    """A random q(v) in every group, away from the prior."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for svgp in model.svgps:
            shape = svgp.q_mean.shape
            svgp.q_mean = torch.randn(shape, generator=generator)
            A = 0.3 * torch.randn(*shape, shape[-1], generator=generator)
            svgp.q_sqrt = torch.linalg.cholesky(A @ A.mT + 0.2 * torch.eye(shape[-1]))


def collapsed_bounds(model) -> torch.Tensor:
    out = torch.empty(model.num_partitions)
    with torch.no_grad():
        for svgp, members in zip(model.svgps, model.group_members, strict=True):
            out[members] = collapsed_bound(svgp, svgp.data_X, svgp.data_y, svgp.data_mask)
    return out


def q_state(model) -> list[torch.Tensor]:
    return [t.detach().clone() for s in model.svgps for t in (s.q_mean, s.q_sqrt)]


@pytest.fixture
def gaussian_model():
    """Two groups (M = 4, 6), hyperparameters and q moved away from their initial values."""
    model = local_model("gaussian")
    train(model, config=TrainConfig(steps=10, lr=0.1, tol=None))
    perturb_q(model)
    return model


def test_one_unit_step_attains_the_collapsed_bound(gaussian_model):
    model = gaussian_model
    hyper = {k: v.clone() for k, v in model.state_dict().items() if "q_" not in k}
    bound = collapsed_bounds(model)
    before = model.elbo()
    assert bool((before < bound - 1.0).all())
    NaturalGradient(model, 1.0)(loss_fn(model))
    assert torch.allclose(model.elbo(), bound, rtol=1e-8, atol=0)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in hyper.items())


def test_a_second_unit_step_is_a_fixed_point(gaussian_model):
    model = gaussian_model
    step = NaturalGradient(model, 1.0)
    step(loss_fn(model))
    first = q_state(model)
    step(loss_fn(model))
    for a, b in zip(first, q_state(model), strict=True):
        assert torch.allclose(a, b, rtol=0, atol=1e-8)


def test_partial_steps_converge_geometrically_to_the_collapsed_bound(gaussian_model):
    """Gaussian: the natural parameters move a fraction γ of the way to the optimum each step."""
    model = gaussian_model
    bound = collapsed_bounds(model)
    gaps, step = [], NaturalGradient(model, 0.5)
    for _ in range(30):
        step(loss_fn(model))
        gaps.append(float((bound - model.elbo()).max()))
    assert all(b < a for a, b in zip(gaps, gaps[1:], strict=False) if a > 1e-9)
    assert gaps[-1] < 1e-6


def gradient_of_mean(model) -> float:
    loss = loss_fn(model)()
    grads = torch.autograd.grad(loss, [s.layer.q_mean_unconstrained for s in model.svgps])
    return max(float(g.abs().max()) for g in grads)


@pytest.mark.parametrize("seed", [0, 1, 5])
@pytest.mark.parametrize("gamma", [0.5, 1.0])
def test_bernoulli_natural_steps_reach_a_stationary_point_long_before_adam(gamma, seed):
    """The safeguarded steps never lower the ELBO and reach ∇_m < 1e-6 within a few dozen steps
    whatever the data draw, where 100 Adam steps on q(u) have not come near."""
    x, y, partition = data("bernoulli", seed=seed)
    model = LocalGPs(x, y, partition, [4, 6, 4], "bernoulli", inducing_init="grid")
    step = NaturalGradient(model, gamma)
    elbos = [model.elbo().sum().item()]
    while gradient_of_mean(model) > 1e-6:
        step(loss_fn(model))
        elbos.append(model.elbo().sum().item())
        assert len(elbos) <= 60
    assert all(b >= a - 1e-9 * abs(a) for a, b in zip(elbos, elbos[1:], strict=False))
    assert elbos[-1] > elbos[0] + 1.0

    adam_model = LocalGPs(x, y, partition, [4, 6, 4], "bernoulli", inducing_init="grid")
    optimizer = torch.optim.Adam(NaturalGradient(adam_model, 1.0).parameters, lr=0.05)
    loss = loss_fn(adam_model)
    for _ in range(100):
        optimizer.zero_grad()
        loss().backward()
        optimizer.step()
    assert gradient_of_mean(adam_model) > 1e-3
    assert adam_model.elbo().sum().item() < elbos[-1]


@pytest.mark.parametrize("likelihood", ["gaussian", "bernoulli", "categorical"])
def test_a_batched_step_equals_steps_on_each_partition_alone(likelihood):
    batched = local_model(likelihood, num_inducing=(5, 5, 5))
    perturb_q(batched)
    before = {key: value.clone() for key, value in batched.state_dict().items()
              if "data_" not in key}
    NaturalGradient(batched, 0.7)(loss_fn(batched))
    svgp = batched.svgps[0]
    x, y, partition = data(likelihood)
    for k in range(len(SIZES)):
        index = torch.as_tensor(partition.indices(k))
        alone = LocalGPs(x[index], y[index], Partition(np.zeros(len(index), dtype=np.int64),
                                                       {"kind": "random", "num_partitions": 1}),
                         5, likelihood, options(likelihood), inducing=[svgp.inducing[k].detach()])
        alone.load_state_dict({**alone.state_dict(),
                               **{key: value[k:k + 1] for key, value in before.items()}})
        NaturalGradient(alone, 0.7)(loss_fn(alone))
        assert torch.allclose(alone.svgps[0].q_mean, svgp.q_mean[k:k + 1], rtol=0, atol=1e-10)
        assert torch.allclose(alone.svgps[0].q_sqrt, svgp.q_sqrt[k:k + 1], rtol=0, atol=1e-10)


def test_training_with_natural_steps_beats_adam_after_few_steps():
    x, y, partition = data("gaussian", sizes=(30, 45, 60))
    spec = LocalFitSpec(num_inducing=6, collapsed=False)
    adam = fit_local((x.numpy(), y.numpy(), partition), spec, TrainConfig(steps=30, tol=None))
    natural = fit_local((x.numpy(), y.numpy(), partition), spec,
                        TrainConfig(steps=30, tol=None, natural_gradient_lr=1.0))
    assert natural.result.steps == adam.result.steps == 30
    gain = natural.model.elbo() - adam.model.elbo()
    assert bool((gain > 1.0).all())


def test_the_recorded_loss_is_taken_after_the_natural_step():
    """Gaussian, γ = 1: the loss of the first optimiser step is minus the collapsed bound at the
    initial hyperparameters."""
    model = local_model("gaussian")
    bound = collapsed_bounds(model).sum()
    result = train(model, config=TrainConfig(steps=1, tol=None, natural_gradient_lr=1.0))
    assert result.losses[0] == pytest.approx(-float(bound), rel=1e-10)


def test_natural_steps_resume_from_a_checkpoint(tmp_path):
    def config(**kwargs):
        return TrainConfig(**{"steps": 12, "tol": None, "natural_gradient_lr": 0.8,
                              "checkpoint": tmp_path / "fit.safetensors", **kwargs})

    whole = local_model("bernoulli")
    reference = train(whole, config=TrainConfig(steps=12, tol=None,
                                                      natural_gradient_lr=0.8))
    first = local_model("bernoulli")
    train(first, config=config(checkpoint_every=5, steps=5))
    resumed = local_model("bernoulli")
    result = train(resumed, config=config(resume=True))
    assert result.steps == 12
    assert result.losses == pytest.approx(reference.losses, rel=1e-12)
    for key, value in whole.state_dict().items():
        assert torch.allclose(resumed.state_dict()[key], value, rtol=1e-10, atol=1e-12), key


def test_natural_gradients_need_uncollapsed_svgp_groups():
    x, y, partition = data("gaussian")
    collapsed = LocalGPs(x, y, partition, 4, collapsed=True)
    with pytest.raises(ValueError, match="collapsed"):
        train(collapsed, config=TrainConfig(steps=1, natural_gradient_lr=1.0))
    with pytest.raises(ValueError, match="sparse-GP layer"):
        NaturalGradient(torch.nn.Linear(2, 2), 1.0)
    for bad in (0.0, -0.5, 1.5):
        with pytest.raises(ValueError, match="natural_gradient_lr"):
            TrainConfig(natural_gradient_lr=bad)


def test_fit_local_command_takes_a_natural_gradient_step_size(capsys, tmp_path):
    x, y, _ = data("gaussian", sizes=(40, 40))
    path = tmp_path / "data.csv"
    np.savetxt(path, np.column_stack([x[:, 0].numpy(), y.numpy()]), delimiter=",",
               header="x,y", comments="")
    common = ["fit-local", str(path), "--target", "y", "--partitions", "2", "--inducing", "5",
              "--steps", "10"]
    assert main([*common, "--natural-gradient", "1", "--out", str(tmp_path / "ng")]) == 0
    assert "2 modules" in capsys.readouterr().out
    assert main([*common, "--natural-gradient", "2", "--out", str(tmp_path / "bad")]) != 0
    error = capsys.readouterr().err
    assert "--natural-gradient" in error and len(error.strip().splitlines()) == 1
    assert not (tmp_path / "bad").exists()
    assert main([*common, "--natural-gradient", "1", "--collapsed",
                 "--out", str(tmp_path / "both")]) != 0
    assert "--collapsed" in capsys.readouterr().err
    assert not (tmp_path / "both").exists()


@pytest.mark.parametrize("likelihood", ["gaussian", "bernoulli"])
def test_modules_fitted_with_unit_natural_steps_can_be_recycled(likelihood):
    """After a unit step the whitened S is ≤ I (P' = I − 2∂E/∂S for a log-concave likelihood), so
    every module's site precision S_k⁻¹ − K_kk⁻¹ is positive semi-definite and the ensemble bound
    of the modules is bounded, however few steps were taken."""
    x, y, partition = data(likelihood, sizes=(30, 45, 60))
    fit = fit_local((x.numpy(), y.numpy(), partition), LocalFitSpec(num_inducing=6,
                                                                  collapsed=False,
                                                                  likelihood=likelihood),
                    TrainConfig(steps=3, tol=None, natural_gradient_lr=1.0))
    assert ModuleStack.from_modules(fit.modules).indefinite_sites() == []
    meta = recycle(fit.modules, RecycleSpec(num_inducing=8, collapsed=True),
                   TrainConfig(optimizer="lbfgs", lr=1.0, steps=2)).model
    assert meta.check_bounded() > 0


def test_unit_steps_never_lower_a_partitions_elbo():
    """With the robust-max likelihood a plain unit step overshoots here (a partition's ELBO
    falls); the safeguarded step halves γ for that partition only, so no step lowers any
    partition's ELBO."""
    likelihood = "categorical"
    model = local_model(likelihood, num_inducing=(5, 5, 5))
    perturb_q(model)
    start = model.elbo().detach()

    plain = local_model(likelihood, num_inducing=(5, 5, 5))
    plain.load_state_dict(model.state_dict())
    svgp = plain.svgps[0]
    loss = loss_fn(plain)()
    mean_grad, sqrt_grad = torch.autograd.grad(loss, svgp.layer.variational_parameters())
    with torch.no_grad():
        mean, chol, ok = natural_update(svgp.q_mean.clone(), svgp.q_sqrt.clone(), -mean_grad,
                                        -covariance_gradient(svgp.q_sqrt, sqrt_grad), 1.0)
        svgp.q_mean = torch.where(ok.unsqueeze(-1), mean, svgp.q_mean)
        svgp.q_sqrt = torch.where(ok[..., None, None], chol, svgp.q_sqrt)
    assert bool((plain.elbo() < start).any())  # the overshoot the safeguard is for

    elbos, step = [start], NaturalGradient(model, 1.0)
    for _ in range(10):
        step(loss_fn(model))
        elbos.append(model.elbo().detach())
    history = torch.stack(elbos)
    assert bool((history[1:] >= history[:-1] - 1e-9 * history[:-1].abs()).all())
    assert bool((history[-1] > start).all())
