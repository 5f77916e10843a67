"""Device discipline, checked without a GPU.

Every model's objective, its gradient and its prediction run on PyTorch's ``meta`` device, where
any tensor made without ``device=`` lands on the CPU and the first operation mixing it with the
model's tensors fails ("Tensor on device cpu is not on the expected device meta"), and where
reading a value back to the host fails too (a meta tensor has no data); Pyro's argument
validation, which checks values on the host, is off as in the library's trainer. The model is
built and initialised on the CPU by its own fit function (float64) and then moved, with every
tensor it keeps. And no training step of any model reads a value back to the host: reads are
counted per step.
"""

import contextlib
import os
import sys
from dataclasses import replace

import pyro
import pytest
import torch
from pyrogp_models.inference.mean_field_elbo import DeviceMeanFieldELBO

from model_zoo import CASES, built, move_to
from pyrogp_models.gaussian.linalg import deferred_checks

META = torch.device("meta")


def prediction_param(name):
    reason = CASES[name].meta_prediction_fails
    marks = [pytest.mark.xfail(reason=reason, strict=True)] if reason else []
    return pytest.param(name, marks=marks)


def on_meta(name):
    model = built(name)
    pyro.clear_param_store()  # a CPU value in the global store would shadow the moved one
    move_to(model, META)
    if hasattr(model, "check_every"):  # the meta-GP's boundedness guard reads λ_min once per
        model.evaluations, model.check_every = 1, 10**9  # window, by design: not in this check
    return model


def assert_on_meta(tensors):
    for tensor in tensors:
        assert tensor.device == META


@pytest.mark.parametrize("name", list(CASES))
def test_objective_and_gradient_run_on_another_device(name):
    model = on_meta(name)
    parameters = [p for p in model.parameters() if p.requires_grad]
    with deferred_checks(), pyro.validation_enabled(False):
        loss = DeviceMeanFieldELBO().differentiable_loss(model.model, model.guide)
        loss.backward()
        assert_on_meta([loss, *(p.grad for p in parameters if p.grad is not None)])
        assert any(p.grad is not None for p in parameters)
        collapsed = (model.collapsed_objective() if getattr(model, "collapsible", False)
                     else contextlib.nullcontext())  # a multitask iGP's tasks split there
        with collapsed:
            members = getattr(model, "member_objectives", lambda: None)() or []
            for block, objective in members:
                value = objective()
                assert_on_meta([value, *torch.autograd.grad(value.sum(), block)])
            if getattr(model, "collapsible", False):  # the bound itself (cGP's block algebra)
                held = [p for p in model.parameters() if p.requires_grad]
                bound = model.collapsed_bound()
                assert_on_meta([bound, *torch.autograd.grad(bound, held)])


@pytest.mark.parametrize("name", [prediction_param(name) for name in CASES])
def test_prediction_runs_on_another_device(name):
    model = on_meta(name)
    X = torch.zeros(5, 1, dtype=torch.float64, device=META)  # every case has one input
    with deferred_checks(), torch.no_grad(), pyro.validation_enabled(False):
        trace = CASES[name].predict_sites(model, X)
    values = [site["value"] for site in trace.nodes.values()
              if site["type"] == "sample" and torch.is_tensor(site["value"])]
    assert values
    assert_on_meta(values)


def test_a_tensor_made_without_a_device_is_caught():
    """The check can fail: a factory call without ``device=`` next to meta tensors raises."""
    model = on_meta("local-collapsed")
    with pytest.raises(RuntimeError, match="device"):
        model.groups[0].data_y + torch.ones(model.groups[0].data_y.shape[-1])


# Host reads per training step ------------------------------------------------------------------
#: What reads a tensor's value back to the host (on a GPU: a device synchronisation).
HOST_READS = ("__bool__", "__float__", "__int__", "__index__", "item", "tolist", "cpu",
              "numpy", "__array__")


class HostReadCounter:
    """Counts calls of :data:`HOST_READS` on tensors, except those of torch's optimisers: Adam
    keeps its step counter on the host (``capturable=False``), so reading it is no device
    synchronisation."""

    def __init__(self, monkeypatch):
        self.count = 0
        for method in HOST_READS:
            monkeypatch.setattr(torch.Tensor, method, self._counting(getattr(torch.Tensor,
                                                                             method)))

    def _counting(self, original):
        def counted(tensor, *args, **kwargs):
            if not _called_from_torch_optim():
                self.count += 1
            return original(tensor, *args, **kwargs)
        return counted


def _called_from_torch_optim() -> bool:
    frame = sys._getframe(2)
    for _ in range(4):
        if frame is None:
            return False
        if f"torch{os.sep}optim{os.sep}" in frame.f_code.co_filename:
            return True
        frame = frame.f_back
    return False


def reads_of_a_fit(name, steps, monkeypatch) -> tuple[int, int]:
    """(host reads, steps taken) of the case's fit — building, training with its default
    optimiser for ``steps`` steps (convergence windows of 10 steps, no early stop) and
    export."""
    counter = HostReadCounter(monkeypatch)
    fitted = CASES[name].fit(torch.float64,
                             lambda config: replace(config, steps=steps, window=10, tol=None))
    monkeypatch.undo()
    return counter.count, fitted.result.steps


@pytest.mark.filterwarnings("ignore::pyrogp_models.errors.NotConvergedWarning")
@pytest.mark.parametrize("name", list(CASES))
def test_training_steps_read_nothing_back_to_the_host(name, monkeypatch):
    """Twenty more training steps add fewer than twenty host reads (the trainer looks at the
    losses once per window of 10 steps): building and exporting the model, which may read, cost
    the same in both fits and cancel."""
    few, few_steps = reads_of_a_fit(name, 10, monkeypatch)
    more, more_steps = reads_of_a_fit(name, 30, monkeypatch)
    assert (few_steps, more_steps) == (10, 30)
    assert more - few < more_steps - few_steps, f"{more - few} reads in 20 steps"


def test_the_host_read_counter_counts(monkeypatch):
    counter = HostReadCounter(monkeypatch)
    value = torch.ones(3)
    bool(value.sum() > 0), float(value.sum()), value.tolist(), value[0].item()
    monkeypatch.undo()
    assert counter.count == 4
