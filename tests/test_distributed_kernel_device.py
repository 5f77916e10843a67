"""Device discipline of the distributed-kernel GP: its objectives, gradients and predictions make
no tensor on the default device and its training steps read nothing back to the host; float32
fits train without NaN and agree with float64 to float32 accuracy.

Two guards, as no GPU is at hand:

- the ``meta`` device (shapes only, no values): a tensor made on the default device (CPU) meets a
  meta tensor and raises, and so does any read of a value; an objective and its gradient that run
  there read nothing back;
- :class:`DefaultDeviceGuard` around a whole CPU fit, prediction and draw (where reads are
  allowed: predictions size their halos exactly): it records every tensor factory the library's
  own code calls without a device (``torch.zeros(n)``, ``torch.tensor(x)``, ...);

and a count of the values read back during a whole fit, per training step.

Pyro's ``TraceMeanField_ELBO`` reads its loss back (``torch_item``) at every evaluation and its
argument validation (on by default) checks distribution parameters on the host: on the meta
device the model and guide are therefore traced directly (one-sample ELBO), with validation off.
The default fit (the collapsed bound by the batched L-BFGS) does not go through either.
"""

import math
import sys
from dataclasses import replace
from pathlib import Path

import pyro
import pytest
import torch
from pyro import poutine
from pyrogp_models.inference.distributed_kernel_fit import (
    DistributedKernelSpec,
    build_model,
    default_config,
    fit_distributed_kernel,
    model_data,
)
from pyrogp_models.inference.trainer import TrainConfig, train
from torch.overrides import TorchFunctionMode
from torch.utils._device import _device_constructors
from torch.utils._python_dispatch import TorchDispatchMode

import pyrogp_models
from pyrogp_models import inference
from pyrogp_models.gaussian.linalg import deferred_checks
from pyrogp_models.models.distributed_kernel.construct import build_distributed_kernel_gp
from pyrogp_models.models.distributed_kernel.halo import CHECK_EVERY

#: Operators that hand a value (or a data-dependent shape) back to the host.
HOST_READS = ("_local_scalar_dense", "nonzero", "masked_select", "unique", "equal",
              "is_nonzero", "allclose")


class ReadCounter(TorchDispatchMode):
    """Counts the operators of :data:`HOST_READS` dispatched inside it."""

    def __init__(self):
        super().__init__()
        self.reads = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.__name__.split(".")[0] in HOST_READS or "unique" in func.__name__:
            self.reads += 1
        return func(*args, **(kwargs or {}))


class DefaultDeviceGuard(TorchFunctionMode):
    """Records the tensor factories called without ``device=`` from the library's own files
    (not from torch or Pyro), with the calling line."""

    LIBRARY = (str(Path(pyrogp_models.__file__).parent), str(Path(inference.__file__).parent))

    def __init__(self):
        super().__init__()
        self.offences: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        inherits = func in (torch.tensor, torch.as_tensor, torch.asarray) and args \
            and torch.is_tensor(args[0])
        if func in _device_constructors() and kwargs.get("device") is None and not inherits:
            caller = sys._getframe(1)
            while caller and "/torch/" in caller.f_code.co_filename:
                caller = caller.f_back
            if caller and caller.f_code.co_filename.startswith(self.LIBRARY):
                self.offences.append(f"{caller.f_code.co_filename}:{caller.f_lineno} "
                                     f"{func.__name__}")
        return func(*args, **kwargs)


def chirp(n: int = 400, dtype=torch.float64, seed: int = 0):
    """Sorted inputs on [0, 20] and a chirp of growing detail with noise 0.1."""
    generator = torch.Generator().manual_seed(seed)
    X = (torch.rand(n, 1, generator=generator, dtype=dtype) * 20).sort(0).values
    y = torch.sin(0.3 * X[:, 0] + 0.04 * X[:, 0] ** 2) \
        + 0.1 * torch.randn(n, generator=generator, dtype=dtype)
    return X, y


def one_sample_elbo(model) -> torch.Tensor:
    """log p − log q of one draw of the guide replayed in the model (Pyro's traces, no read)."""
    guide = poutine.trace(model.guide).get_trace()
    joint = poutine.trace(poutine.replay(model.model, trace=guide)).get_trace()
    return joint.log_prob_sum() - guide.log_prob_sum()


def model_on_meta(collapsed: bool, batch_size: int | None = None, variational="meanfield",
                  likelihood="gaussian"):
    """A model built (and its halo widths planned) on the CPU, then moved to the meta device."""
    X, y = chirp()
    if likelihood == "bernoulli":
        y = (y > 0).to(y.dtype)
    model = build_distributed_kernel_gp(X, 4, 6, y, lengthscale=0.8, learn_cuts=True,
                                        variational=variational, likelihood=likelihood,
                                        batch_size=batch_size)
    model.collapsed = collapsed
    with torch.no_grad(), pyro.validation_enabled(False):      # plan the halos' widths
        one_sample_elbo(model)
        if batch_size is not None:
            model.elbo()
    return model.to("meta")


CASES = [(True, None, "meanfield", "gaussian"), (False, None, "meanfield", "gaussian"),
         (False, 100, "meanfield", "gaussian"), (False, None, "joint", "gaussian"),
         (False, None, "meanfield", "bernoulli")]
IDS = ["collapsed", "elbo", "minibatch", "joint", "bernoulli"]


@pytest.mark.parametrize("collapsed,batch_size,variational,likelihood", CASES, ids=IDS)
@pyro.settings.context(module_local_params=True)
def test_objective_and_gradient_run_on_the_meta_device(collapsed, batch_size, variational,
                                                       likelihood):
    """The model's ELBO (or collapsed bound) and the traced model and guide, with gradients,
    on meta tensors, as often as a halo width is kept between two checks: no tensor on the
    default device, no value read."""
    model = model_on_meta(collapsed, batch_size, variational, likelihood)
    parameters = [p for p in model.parameters() if p.requires_grad]
    assert all(p.device.type == "meta" for p in parameters)
    with deferred_checks(), pyro.validation_enabled(False):
        for _ in range(CHECK_EVERY - 2):
            objective = one_sample_elbo(model)
            grads = torch.autograd.grad(objective, parameters, allow_unused=True)
        exact = model.collapsed_bound() if collapsed else model.elbo()
    assert objective.device.type == "meta" and objective.shape == ()
    assert any(g is not None and g.device.type == "meta" for g in grads)
    assert exact.device.type == "meta" and exact.shape == ()


@pyro.settings.context(module_local_params=True)
def test_a_batched_lbfgs_step_of_the_collapsed_bound_runs_on_the_meta_device():
    """The optimiser's step (two evaluations and the update) reads nothing either."""
    from pyrogp_models.inference.batched_lbfgs import BatchedLBFGS

    model = model_on_meta(collapsed=True)
    with deferred_checks():
        optimizer = BatchedLBFGS(model.member_objectives())
        value = optimizer.step()
    assert value.device.type == "meta"


def test_no_tensor_is_made_on_the_default_device():
    """Fit (collapsed, SVI, minibatch SVI), predict and draw under :class:`DefaultDeviceGuard`:
    the library makes every tensor on the data's device."""
    X, y = chirp(300)
    guard = DefaultDeviceGuard()
    with guard:
        for spec in (DistributedKernelSpec(3, 6), DistributedKernelSpec(3, 6, method="svi"),
                     DistributedKernelSpec(3, 6, batch_size=100)):
            fit = fit_distributed_kernel((X, y), spec, TrainConfig(
                optimizer="lbfgs" if spec.method == "solve" else "adam", steps=12, window=4,
                tol=None))
            mean, var = fit.predictor.predict_y(X[:50])
            draws = pyro.infer.Predictive(fit.model.predictive_model,
                                          guide=fit.model.predictive_guide,
                                          num_samples=3)(fit.standardisation.transform_x(X[:5]))
    assert not guard.offences, guard.offences
    assert bool(torch.isfinite(var).all())
    assert draws[fit.model._pyro_get_fullname("y")].shape == (3, 5)


def test_the_default_training_reads_back_less_than_once_per_step():
    """Every value the default fit reads back (the trainer's convergence windows, the halo width
    checks, the L-BFGS set-up), counted: fewer than one per step."""
    X, y = chirp(500)
    spec = DistributedKernelSpec(4, 6)
    Xm, ym, _ = model_data(X, y, spec)
    model = build_model(Xm, ym, spec)
    model.collapsed = True
    counter = ReadCounter()
    with counter:
        result = train(model, config=replace(default_config("solve"), steps=60, tol=None))
    assert result.steps == 60
    assert counter.reads < result.steps, counter.reads


# float32 ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("method", ["solve", "svi"])
def test_float32_fits_are_finite_and_agree_with_float64(method):
    """The default fit in float32 gives finite losses all the way and predictions within float32
    accuracy of the float64 fit's (the lengthscale of the chirp is short: far windows underflow
    in float32)."""
    X, y = chirp(400)
    fits = {}
    for dtype in (torch.float32, torch.float64):
        spec = DistributedKernelSpec(4, 8, method=method, dtype=dtype)
        fits[dtype] = fit_distributed_kernel((X, y), spec)
        assert all(math.isfinite(loss) for loss in fits[dtype].result.losses)
    Xs = torch.linspace(-1, 21, 300, dtype=torch.float64).unsqueeze(-1)
    mean32, var32 = fits[torch.float32].predictor.predict_y(Xs)
    mean64, var64 = fits[torch.float64].predictor.predict_y(Xs)
    assert mean32.dtype == torch.float32
    scale = float(y.std())
    # two optimisations in different precisions stop at slightly different optima
    assert float((mean32.double() - mean64).abs().max()) <= 2e-2 * scale
    assert float((var32.double() / var64 - 1).abs().max()) <= 0.1
