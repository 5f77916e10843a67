"""Training Pyro models by stochastic variational inference.

The loss is Pyro's ``TraceMeanField_ELBO`` (analytic KL terms) of a PyroModule's ``model`` and
``guide``; parameters are the module's own (``pyro.settings.set(module_local_params=True)``, so
several models live in one process). Optimisers: Adam, or full-batch L-BFGS with a strong-Wolfe
line search. Losses stay on the device and are read back only once per convergence window, so the
loop does not synchronise with an accelerator at every step.

With ``natural_gradient_lr`` set, q(u) of every
:class:`~pyrogp_models.models.local.svgp.BatchedSVGP` group is
updated by a natural-gradient step of that size (:mod:`inference.natural_gradient`) and the
optimiser then takes one step on every other parameter, at the new q(u); the recorded loss is the
one of that optimiser step. Each of the two evaluates the loss (with minibatches, on its own draw).

Convergence: stop when the mean loss of the last ``window`` steps differs from that of the window
before by less than ``tol`` relative. Checkpoints (safetensors + JSON, written atomically) hold
the parameters, the optimiser state, the step, the loss history and the random state, so a fit
resumes exactly where it stopped.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import pyro
import torch
from pyro.infer import TraceMeanField_ELBO
from safetensors.torch import load_file
from safetensors.torch import save as save_safetensors
from tqdm import tqdm

from inference.natural_gradient import natural_gradient_step, split_parameters
from pyrogp_models.modules.files import atomic_write

pyro.settings.set(module_local_params=True)


@dataclass
class TrainConfig:
    """How to train. ``steps`` is the maximum number of optimiser steps. ``natural_gradient_lr``:
    step size γ of a natural-gradient step on q(u) before every optimiser step (None: q(u) is
    optimised with the other parameters)."""

    optimizer: str = "adam"
    lr: float = 0.05
    steps: int = 1000
    tol: float | None = 1e-6
    window: int = 50
    seed: int | None = 0
    progress: bool = False
    checkpoint: str | Path | None = None
    checkpoint_every: int = 500
    resume: bool = False
    natural_gradient_lr: float | None = None

    def __post_init__(self):
        if self.optimizer not in ("adam", "lbfgs"):
            raise ValueError(f"unknown optimizer '{self.optimizer}'; choose adam or lbfgs")
        gamma = self.natural_gradient_lr
        if gamma is not None and not 0.0 < gamma <= 1.0:
            raise ValueError(f"natural_gradient_lr must be in (0, 1], got {gamma}")


@dataclass
class TrainResult:
    """Loss history (negative ELBO summed over the model's pieces) and how training ended."""

    losses: list[float] = field(default_factory=list)
    converged: bool = False
    steps: int = 0

    @property
    def final_loss(self) -> float:
        return self.losses[-1] if self.losses else math.nan


def _make_optimizer(config: TrainConfig, params):
    if config.optimizer == "adam":
        return torch.optim.Adam(params, lr=config.lr)
    return torch.optim.LBFGS(params, lr=config.lr, max_iter=20, history_size=50,
                             line_search_fn="strong_wolfe", tolerance_grad=1e-12,
                             tolerance_change=1e-14)


def _converged(losses: torch.Tensor, step: int, window: int, tol: float) -> bool:
    if step < 2 * window:
        return False
    recent = losses[step - window:step].mean()
    before = losses[step - 2 * window:step - window].mean()
    return bool((recent - before).abs() <= tol * recent.abs().clamp_min(1.0))


def train(module: pyro.nn.PyroModule, *args, config: TrainConfig | None = None,
          **kwargs) -> TrainResult:
    """Maximise the ELBO of ``module.model`` / ``module.guide`` called with ``args, kwargs``."""
    config = config or TrainConfig()
    elbo = TraceMeanField_ELBO()
    groups = None
    params = list(module.parameters())
    if config.natural_gradient_lr is not None:
        groups, params = split_parameters(module)
    optimizer = _make_optimizer(config, params)
    result = TrainResult()
    start = 0
    if config.resume and config.checkpoint and Path(config.checkpoint).exists():
        start, result.losses = load_checkpoint(config.checkpoint, module, optimizer)
    elif config.seed is not None:
        pyro.set_rng_seed(config.seed)

    def loss_fn():
        return elbo.differentiable_loss(module.model, module.guide, *args, **kwargs)

    def closure():
        optimizer.zero_grad()
        loss = loss_fn()
        loss.backward(inputs=None if groups is None else params)  # q(u): natural step
        return loss

    reference = params[0] if params else torch.zeros(())
    losses = torch.full((config.steps,), math.nan, dtype=reference.dtype,
                        device=reference.device)
    losses[:start] = torch.as_tensor(result.losses[:start], dtype=losses.dtype)
    bar = tqdm(total=config.steps, initial=start, disable=not config.progress, desc="fit",
               leave=False)
    step = start
    try:
        while step < config.steps:
            if groups is not None:
                natural_gradient_step(loss_fn, groups, config.natural_gradient_lr)
            if config.optimizer == "adam":
                loss = closure()
                optimizer.step()
            else:
                loss = optimizer.step(closure)
            losses[step] = loss.detach()
            step += 1
            bar.update(1)
            if step % config.window == 0:
                if not bool(torch.isfinite(losses[step - 1])):
                    raise FloatingPointError(f"the loss became {losses[step - 1].item()} at "
                                             f"step {step}; try a smaller learning rate")
                bar.set_postfix(loss=f"{losses[step - 1].item():.4g}")
                if config.tol is not None and _converged(losses, step, config.window,
                                                         config.tol):
                    result.converged = True
                    break
            if config.checkpoint and step % config.checkpoint_every == 0:
                save_checkpoint(config.checkpoint, module, optimizer, step, losses[:step])
    finally:
        bar.close()
    result.losses = losses[:step].tolist()
    result.steps = step
    if config.checkpoint:
        save_checkpoint(config.checkpoint, module, optimizer, step, losses[:step])
    return result


# Checkpoints --------------------------------------------------------------------------------
def save_checkpoint(path, module, optimizer, step: int, losses: torch.Tensor) -> None:
    """Write parameters, optimiser state and random state to ``path`` (+ ``path.json``)."""
    path = Path(path)
    tensors = {f"param.{k}": v.detach().contiguous() for k, v in module.state_dict().items()}
    state = optimizer.state_dict()
    scalars = {}
    for index, per_param in state["state"].items():
        for key, value in per_param.items():
            if torch.is_tensor(value):
                tensors[f"optim.{index}.{key}"] = value.detach().contiguous()
            else:
                scalars[f"{index}.{key}"] = value
    tensors["rng.torch"] = torch.get_rng_state()
    meta = {"step": step, "losses": losses.tolist(), "param_groups": state["param_groups"],
            "optimizer_scalars": scalars}
    atomic_write(path, save_safetensors(tensors))
    atomic_write(path.with_suffix(path.suffix + ".json"), json.dumps(meta).encode())


def load_checkpoint(path, module, optimizer) -> tuple[int, list[float]]:
    """Restore what :func:`save_checkpoint` wrote; returns (step, loss history)."""
    path = Path(path)
    tensors = load_file(path)
    meta = json.loads(path.with_suffix(path.suffix + ".json").read_text())
    module.load_state_dict({k[len("param."):]: v for k, v in tensors.items()
                            if k.startswith("param.")})
    state: dict = {}
    for key, value in tensors.items():
        if key.startswith("optim."):
            _, index, name = key.split(".", 2)
            state.setdefault(int(index), {})[name] = value
    for key, value in meta["optimizer_scalars"].items():
        index, name = key.split(".", 1)
        state.setdefault(int(index), {})[name] = value
    optimizer.load_state_dict({"state": state, "param_groups": meta["param_groups"]})
    torch.set_rng_state(tensors["rng.torch"])
    return meta["step"], meta["losses"]
