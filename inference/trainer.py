"""Training Pyro models by stochastic variational inference: the library's one trainer.

The loss is Pyro's ``TraceMeanField_ELBO`` (analytic KL terms) of a PyroModule's ``model`` and
``guide``, both called with no arguments (every model binds its data) unless ``args`` are given,
evaluated without Pyro's host reads
(:class:`~pyrogp_models.inference.mean_field_elbo.DeviceMeanFieldELBO`; Pyro's argument
validation, which checks every distribution on the host, is off inside the loop). The loop runs
in a scope of Pyro's parameter store (``ParamStoreDict.scope``), so a fit leaves nothing in the
global store — the parameters live in the model — unless ``TrainConfig.global_param_store`` asks
for it.
Optimisers: Adam, or full-batch L-BFGS — for a model of independent members (the local GPs
of K partitions: ``member_objectives()``) one memory and one step length per member
(:mod:`pyrogp_models.inference.batched_lbfgs`), otherwise torch's L-BFGS with a strong-Wolfe line
search.

Pre-step hooks run before every optimiser step and own some parameters, which the optimiser then
leaves alone: a natural-gradient step on every q(u)
(:class:`pyrogp_models.inference.natural_gradient.NaturalGradient`, from ``natural_gradient_lr``),
or a closed-form solve for q (the distributed kernel's conjugate-gradient solve). The recorded loss
is the one of the optimiser's step. The hooks run once more after the last step, so that what they
own matches the final parameters: a q(u) set for the parameters before the last optimiser step can
be far from optimal after it (with a small Gaussian noise σ², a 5 % move of the hyperparameters
costs thousands of nats).

No value is read back to the host inside a step: losses stay on the device and factorisations
run under :func:`~pyrogp_models.gaussian.linalg.deferred_checks` (a failed Cholesky factor turns
the loss NaN). The loss history is read once per convergence window of ``window`` steps, where a
non-finite loss stops the fit with one line naming the cause. (Torch's L-BFGS, used for a model
without ``member_objectives()``, compares losses on the host in its line search; a trial point
whose loss is not finite is a wall it backs off from.)

Convergence: stop when the mean loss of the last ``window`` steps differs from that of the window
before by less than ``tol`` relative. Independent members under the batched L-BFGS are judged
one by one: first on the change of their own objective over a window, then — once every member
has passed that — on their objective evaluated precisely (``member_objectives(precise=True)``),
until each is pinned at its optimum to rounding
(:meth:`pyrogp_models.inference.batched_lbfgs.BatchedLBFGS.pinned`), so that a partition's module
does not depend on which others shared its batch; members still unpinned after
:data:`HOLD_AFTER` judgements of that phase are pinned with the model's ``held_parameters()``
(inducing inputs) held where they are. ``time_budget`` stops after that many seconds. With
``patience`` the fit also stops once that many windows in a row end above the lowest window so
far, back at the parameters of the end of that window (:class:`BestWindow`); a window is judged
by its mean loss, or by ``precise_loss()`` at its end when the caller gives one (a Monte Carlo
loss estimated with many fixed draws).
Checkpoints (safetensors + JSON, written atomically) hold the parameters, the optimiser state, the
step, the loss history and the random state — never data (models register their data as
non-persistent buffers) — so a fit resumes exactly where it stopped.
"""

from __future__ import annotations

import json
import math
import time
import warnings
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Protocol

import pyro
import torch
from pyrogp_models.inference.batched_lbfgs import BatchedLBFGS
from pyrogp_models.inference.mean_field_elbo import DeviceMeanFieldELBO
from pyrogp_models.inference.natural_gradient import NaturalGradient
from pyrogp_models.inference.protocols import HeldParameters, IndependentMembers, NoisyObjective
from pyrogp_models.inference.train_config import TrainConfig
from safetensors.torch import load_file
from safetensors.torch import save as save_safetensors
from tqdm import tqdm

from pyrogp_models.errors import CholeskyError, NotConvergedWarning
from pyrogp_models.gaussian.linalg import deferred_checks
from pyrogp_models.modules.signed import atomic_write


@dataclass
class TrainResult:
    """Loss history (negative ELBO summed over the model's pieces) and how training ended:
    ``seconds`` is the wall time of the loop, ``change`` the relative change of the loss over
    the last convergence window (for independent members: the largest member's; for a module
    whose ``noisy_objective`` is true, only the change beyond twice its standard error), and
    ``member_converged`` — for a model of independent members trained by the batched L-BFGS —
    which members passed the convergence test (in the order of ``member_objectives()``);
    ``returned_to`` the step whose parameters a fit stopped by ``patience`` returned to;
    ``held`` whether the precise phase held the model's ``held_parameters()`` to pin the
    others (the module docstring)."""

    losses: list[float] = field(default_factory=list)
    converged: bool = False
    held: bool = False
    steps: int = 0
    seconds: float = 0.0
    change: float = math.nan
    member_converged: list[bool] | None = None
    returned_to: int | None = None

    @property
    def final_loss(self) -> float:
        return self.losses[-1] if self.losses else math.nan

    def followed_by(self, later: TrainResult) -> TrainResult:
        """The record of this training and then ``later`` (of the same model, or of a second
        path to the same fit): both parts' losses, steps and seconds, how ``later`` ended."""
        return replace(later, losses=self.losses + later.losses, steps=self.steps + later.steps,
                       seconds=self.seconds + later.seconds,
                       returned_to=None if later.returned_to is None
                       else self.steps + later.returned_to)


class PreStepHook(Protocol):
    """Runs before each optimiser step; ``parameters`` are the ones it updates itself."""

    parameters: Sequence[torch.nn.Parameter]

    def __call__(self, loss_fn: Callable[[], torch.Tensor]) -> None: ...


def _make_optimizer(config: TrainConfig, params, module):
    if config.optimizer == "adam":
        return torch.optim.Adam(params, lr=config.lr)
    members = module.member_objectives() if isinstance(module, IndependentMembers) else None
    if members is not None:
        return BatchedLBFGS(members)
    return torch.optim.LBFGS(params, lr=config.lr, max_iter=20, history_size=50,
                             line_search_fn="strong_wolfe", tolerance_grad=1e-12,
                             tolerance_change=1e-14)


def _relative_change(losses: torch.Tensor, step: int, window: int, noisy: bool = False
                     ) -> torch.Tensor:
    """|mean of the last window − mean of the window before| / max(1, |mean of the last|); for
    a ``noisy`` (estimated) loss, only the part of the change beyond twice its standard error
    (from the spread within the two windows) counts."""
    if step < 2 * window:
        return losses.new_tensor(math.inf)
    recent, before = losses[step - window:step], losses[step - 2 * window:step - window]
    change = (recent.mean() - before.mean()).abs()
    if noisy and window > 1:
        change = (change - 2 * ((recent.var() + before.var()) / window).sqrt()).clamp_min(0.0)
    return change / recent.mean().abs().clamp_min(1.0)


#: A member's objective "has not changed" when its relative change is at most this many ε.
STILL = 4
#: Judgements in a row without a change after which a member counts as converged.
STILL_WINDOWS = 3
#: Judgements of the precise phase after which members not yet pinned go on with the model's
#: ``held_parameters()`` (its inducing inputs) held where they are.
HOLD_AFTER = 10


class _MemberConvergence:
    """Per-member convergence of a batched L-BFGS's objectives, judged at window ends: first the
    relative change of each member's objective since the last judgement; once every member has
    passed that, the objectives evaluated precisely, until each is pinned at its optimum (unless
    ``member_objectives(precise=True)`` is None: the change test is then the last).

    Without pinning (``pin`` off: screening restarts) the change test is the last, so it asks
    more: a predicted decrease below the same tolerance too (a member whose steps were all
    rejected has not changed, but it has not converged), or an objective that has not changed
    beyond rounding (:data:`STILL` ε, relative) for :data:`STILL_WINDOWS` judgements in a row
    (its steps are accepted but change nothing).

    A member pinned to rounding has a predicted decrease below ε^PINNED, or rounding hides
    any further decrease: its steps were all rejected, or its objective has not changed
    beyond :data:`STILL` ε for :data:`STILL_WINDOWS` judgements in a row (accepted steps too
    small to change it: a periodic kernel's period held, its other values pinned, predicted
    3e-11 nats and changing nothing for 2600 steps in float64).

    Members that :data:`HOLD_AFTER` judgements of the precise phase have not pinned go on with the
    model's ``held_parameters()`` (:class:`~pyrogp_models.inference.protocols.HeldParameters`)
    held where they are, and are pinned in the others: inducing inputs in several dimensions
    can creep along directions that change the bound by ~10⁻⁵ nats per step for thousands of
    steps, where the kernel and likelihood parameters given them pin in tens."""

    def __init__(self, optimizer: BatchedLBFGS, module, pin: bool = True):
        self.optimizer = optimizer
        self.module = module
        self.pin = pin
        self.still: torch.Tensor | int = 0  # judgements in a row without a change
        self.previous: torch.Tensor | None = None
        self.refining = False
        self.refinements = 0  # judgements of the precise phase
        self.held = False
        self.finished = False

    def change(self) -> torch.Tensor:
        """The change since the last call; members frozen earlier count as converged."""
        now = torch.cat(self.optimizer.member_values())
        frozen = ~torch.cat([block.active for block in self.optimizer.blocks])
        change = (torch.full_like(now, math.inf) if self.previous is None
                  else (now - self.previous).abs() / now.abs().clamp_min(1.0))
        self.previous = now
        return torch.where(frozen, 0.0, change)

    def judge(self, change: torch.Tensor, tol: float | None) -> torch.Tensor:
        """Which members have converged (they are frozen); sets ``finished`` when all are
        pinned. Without ``tol`` only members that stopped moving are frozen."""
        quiet = change <= STILL * torch.finfo(change.dtype).eps
        self.still = torch.where(quiet, self.still + 1, 0)
        if self.refining:
            converged = self.optimizer.pinned() | (self.still >= STILL_WINDOWS)
            self.refinements += 1
            if self.refinements == HOLD_AFTER and not bool(converged.all()):
                self._hold()
        elif self.pin:
            converged = change <= (tol or 0.0)
        else:
            converged = (change <= (tol or 0.0)) & (self.optimizer.near(tol or 0.0)
                                                    | (self.still >= STILL_WINDOWS))
        self.optimizer.freeze(converged)
        if tol is not None and bool(converged.all()):
            precise = (None if self.refining or not self.pin
                       else self.module.member_objectives(precise=True))
            if precise is None:  # pinned, or not to be pinned, or no precise objective to pin on
                self.finished = True
            else:
                self.optimizer.refine(precise)
                self.refining, self.still = True, 0
        return converged

    def _hold(self) -> None:
        """Hold the model's ``held_parameters()``, if it has any, for the rest of the fit."""
        held = (self.module.held_parameters() if isinstance(self.module, HeldParameters)
                else [])
        if held:
            self.optimizer.hold(held)
            self.held = True


def parameter_scope(config: TrainConfig):
    """A scope of Pyro's parameter store (``ParamStoreDict.scope``) for a fit — building,
    training, export — so that it leaves nothing in the global store (any PyroModule called
    puts its parameters there); a null context when ``config.global_param_store``."""
    return nullcontext() if config.global_param_store else pyro.get_param_store().scope()


def train(module: pyro.nn.PyroModule, *args, config: TrainConfig | None = None,
          hooks: Sequence[PreStepHook] = (), precise_loss: Callable[[], float] | None = None,
          **kwargs) -> TrainResult:
    """Maximise the ELBO of ``module.model`` / ``module.guide`` (called with ``args, kwargs``):
    minimise Pyro's ``TraceMeanField_ELBO`` loss (on the device) by ``config``'s optimiser, with
    ``hooks`` (and a natural-gradient hook when ``config.natural_gradient_lr`` is set) before
    every step; ``precise_loss`` judges the windows of ``config.patience`` (:class:`BestWindow`)."""
    config = config or TrainConfig()
    hooks = list(hooks)
    if config.natural_gradient_lr is not None:
        hooks.append(NaturalGradient(module, config.natural_gradient_lr))
    owned = {id(p) for hook in hooks for p in hook.parameters}
    params = [p for p in module.parameters() if p.requires_grad and id(p) not in owned]
    optimizer = _make_optimizer(config, params, module)
    best = (BestWindow(module, config.window, config.patience, precise_loss)
            if config.patience is not None and not isinstance(optimizer, BatchedLBFGS) else None)
    if isinstance(optimizer, BatchedLBFGS) and hooks:
        raise ValueError("pre-step hooks (natural-gradient steps) go with Adam, not with the "
                         "batched L-BFGS of independent members")
    elbo = DeviceMeanFieldELBO()
    result = TrainResult()
    start = 0
    if config.resume and config.checkpoint and Path(config.checkpoint).exists():
        start, result.losses = load_checkpoint(config.checkpoint, module, optimizer, hooks,
                                               best)
    elif config.seed is not None:
        pyro.set_rng_seed(config.seed)

    def loss_fn():
        return elbo.differentiable_loss(module.model, module.guide, *args, **kwargs)

    def closure():
        optimizer.zero_grad()
        loss = loss_fn()
        if params:
            loss.backward(inputs=params)
        return loss

    reference = next(iter(module.parameters()), None)
    reference = torch.zeros(()) if reference is None else reference  # a module with no parameter
    losses = torch.full((max(min(config.steps, start + 4096), 1),), math.nan,
                        dtype=reference.dtype, device=reference.device)  # grows when needed
    losses[:start] = torch.as_tensor(result.losses[:start], dtype=losses.dtype,
                                     device=losses.device)
    bar = tqdm(total=config.steps, initial=start, disable=not config.progress, desc="fit",
               leave=False)
    members = (_MemberConvergence(optimizer, module, config.pin)
               if isinstance(optimizer, BatchedLBFGS) else None)
    noisy = isinstance(module, NoisyObjective) and bool(module.noisy_objective)
    ladder = _start_needs_ladder(optimizer)
    step, began = start, time.perf_counter()
    try:
        with (deferred_checks(climb_ladder=ladder), pyro.validation_enabled(False),
              parameter_scope(config)):
            while step < config.steps:
                try:
                    for hook in hooks:
                        hook(loss_fn)
                    if isinstance(optimizer, BatchedLBFGS):
                        loss = optimizer.step()
                    elif config.optimizer == "adam":
                        loss = closure()
                        if params:
                            optimizer.step()
                    else:
                        loss = _torch_lbfgs_step(optimizer, closure, params)
                except ValueError:
                    _raise_if_not_finite(loss_fn, step + 1, config)
                    raise
                if step == len(losses):
                    losses = torch.cat([losses, torch.full_like(losses, math.nan)])
                losses[step] = loss.detach()
                step += 1
                bar.update(1)
                out_of_time = (config.time_budget is not None
                               and time.perf_counter() - began >= config.time_budget)
                if step % config.window == 0 or step == config.steps or out_of_time:
                    _check_finite(losses, step, loss_fn, config)
                    bar.set_postfix(loss=f"{losses[step - 1].item():.4g}")
                    change = (members.change() if members is not None
                              else _relative_change(losses, step, config.window, noisy))
                    result.change = float(change.max())
                    if members is not None:
                        result.member_converged = members.judge(change, config.tol).tolist()
                        result.held = members.held
                    if config.tol is not None and (members.finished if members is not None
                                                   else result.change <= config.tol):
                        result.converged = True
                        break
                    if best is not None and step % config.window == 0 and best.stalled(losses,
                                                                                      step):
                        result.converged, result.returned_to = True, best.step
                        best.restore()
                        break
                if config.checkpoint and step % config.checkpoint_every == 0:
                    save_checkpoint(config.checkpoint, module, optimizer, step, losses[:step],
                                    hooks, best)
                if out_of_time:
                    break
            if config.checkpoint:  # before the closing hooks, so that a resumed fit continues
                save_checkpoint(config.checkpoint, module, optimizer, step, losses[:step], hooks,
                                best)
            for hook in hooks:  # leave what the hooks own consistent with the final parameters
                hook(loss_fn)
    finally:
        bar.close()
    result.losses = losses[:step].tolist()
    result.steps = step
    result.seconds = time.perf_counter() - began
    if config.tol is not None and not result.converged and step > start:
        _warn_not_converged(result, config)
    return result


class BestWindow:
    """The lowest window of the loss so far and the parameters at the end of that window, for
    ``TrainConfig.patience``: :meth:`stalled` says when ``patience`` windows in a row have ended
    above it. Under a fixed learning rate a stochastic objective's loss can rise for hundreds of
    steps and settle above where it was; its lowest window is then the state to keep. A window is
    valued by its mean loss, or by ``precise_loss()`` at its end when one is given: a window mean
    of one-draw estimates averages the loss along the path, so it can favour a window whose end
    is worse than a later one's. A window ends above the lowest only when its mean loss is above
    the lowest window mean too: a precise value a little above the best (by its Monte Carlo
    error) while the mean still falls is no rise yet. A window below the lowest by less than its
    noise still counts as lower, so the stop never comes earlier than the change test's on a
    flat loss."""

    def __init__(self, module: torch.nn.Module, window: int, patience: int,
                 precise_loss: Callable[[], float] | None = None):
        self.module, self.window, self.patience = module, window, patience
        self.precise_loss = precise_loss
        self.value, self.mean, self.step, self.stale = math.inf, math.inf, 0, 0
        self.state: dict[str, torch.Tensor] = {}

    def stalled(self, losses: torch.Tensor, step: int) -> bool:
        """Judge the window that ends at ``step`` (one host read); a new lowest window keeps the
        module's parameters."""
        if self._lowest(losses, step):
            self.state = {key: value.detach().clone()
                          for key, value in self.module.state_dict().items()}
        return self.stale >= self.patience

    def _lowest(self, losses: torch.Tensor, end: int) -> bool:
        """Whether the window ending at ``end`` is the new lowest (else, unless its mean loss is
        the lowest yet, one more stale window)."""
        mean = float(losses[end - self.window:end].mean())
        value = self.precise_loss() if self.precise_loss is not None else mean
        falling, self.mean = mean < self.mean, min(mean, self.mean)
        if value < self.value:
            self.value, self.step, self.stale = value, end, 0
            return True
        if not falling:
            self.stale += 1
        return False

    def restore(self) -> None:
        """Put the module back at the lowest window's parameters."""
        self.module.load_state_dict(self.state)

    def tensors(self) -> dict[str, torch.Tensor]:
        """The lowest window's parameters, keyed for a checkpoint."""
        return {f"best.{key}": value.contiguous() for key, value in self.state.items()}

    def scalars(self) -> dict[str, float | int]:
        """The lowest window's value and end, the lowest window mean and the stale count, for a
        checkpoint's JSON."""
        return {"value": self.value, "mean": self.mean, "step": self.step, "stale": self.stale}

    def load(self, tensors: dict[str, torch.Tensor], scalars: dict[str, float | int] | None
             ) -> None:
        """Where a checkpoint left it (:meth:`tensors`, :meth:`scalars`); a checkpoint of a fit
        without ``patience`` (no scalars) starts afresh."""
        if scalars is None:
            return
        self.state = {key[len("best."):]: value for key, value in tensors.items()
                      if key.startswith("best.")}
        self.value, self.mean = scalars["value"], scalars["mean"]
        self.step, self.stale = scalars["step"], scalars["stale"]


def _start_needs_ladder(optimizer) -> bool:
    """Whether the loop climbs the jitter ladder on the device in every dtype
    (:func:`~pyrogp_models.gaussian.linalg.deferred_checks`): some member's objective at the
    start is finite only with more jitter than the first rung, which the checked factorisations
    find (and every evaluation after the fit). A meta-GP's K_** at its modules' median
    hyperparameters can be such a start (Mauna Loa CO2 in 8 blocks with a composite kernel: the
    fit stopped with a NaN loss at step 1). The batched L-BFGS only, which rejects non-finite
    trial points, so that only a start can be non-finite; one host read, before the first step."""
    if not isinstance(optimizer, BatchedLBFGS):
        return False
    with deferred_checks():
        deferred = torch.isfinite(optimizer.objective_values())
    if bool(deferred.all()):
        return False
    try:
        checked = torch.isfinite(optimizer.objective_values())
    except CholeskyError:  # no rung helps: the first convergence check names the failure
        return False
    return bool((checked & ~deferred).any())


#: The loss torch's L-BFGS line search is given at a trial point whose loss is not finite: a
#: wall it backs off from (finite, so that its cubic interpolation stays finite).
LINE_SEARCH_WALL = 1e100


def _torch_lbfgs_step(optimizer: torch.optim.LBFGS, closure: Callable[[], torch.Tensor],
                      params: Sequence[torch.nn.Parameter]) -> torch.Tensor:
    """One step of torch's L-BFGS that refuses a trial point whose loss or gradient is not
    finite, as the batched L-BFGS does: trial hyperparameters whose factorisation fails give
    NaN, and torch's strong-Wolfe line search, given NaN, interpolates NaN steps into the
    parameters; far out on a ray where the bound barely changes (a lengthscale and a variance
    growing together) the loss can stay finite while its gradient overflows, and a NaN
    gradient puts NaN into the next direction. Such a point is shown to it as a
    :data:`LINE_SEARCH_WALL` with zero gradient, so that it backs off to a finite point.
    Returns the loss at the step's start (non-finite if the start is: the caller's check names
    it)."""
    evaluations = 0

    def walled_closure() -> torch.Tensor | float:
        nonlocal evaluations
        evaluations += 1
        loss = closure()
        if evaluations == 1 or _finite_point(loss, params):  # L-BFGS reads every loss anyway
            return loss
        for param in params:
            if param.grad is not None:
                param.grad.zero_()
        return LINE_SEARCH_WALL  # a float: no tensor made, none overflowing in float32

    return optimizer.step(walled_closure)


def _finite_point(loss: torch.Tensor, params: Sequence[torch.nn.Parameter]) -> bool:
    """Whether the loss and every gradient are finite (one host read)."""
    gradients = [param.grad.isfinite().all() for param in params if param.grad is not None]
    return bool(torch.stack([loss.isfinite(), *gradients]).all())


def _warn_not_converged(result: TrainResult, config: TrainConfig) -> None:
    """One warning line: where the fit stopped, how far from converged, what to do."""
    unconverged = (0 if result.member_converged is None
                   else result.member_converged.count(False))
    who = (f" ({unconverged} of {len(result.member_converged)} independent members)"
           if unconverged else "")
    limit = (f"its time budget ({config.time_budget:g} s)"
             if config.time_budget is not None and result.steps < config.steps
             else f"its step limit ({result.steps} steps)")
    if math.isinf(result.change):
        change = f"convergence is judged over {config.window} steps, fewer were taken"
    elif config.tol is not None and result.change <= config.tol:
        change = (f"the loss changed by {result.change:.2g} (relative) over the last "
                  f"{config.window} steps, within the tolerance {config.tol:g}, but the "
                  "parameters were not yet pinned at the optimum (pinned, a module does not "
                  "depend on which partitions shared its batch)")
    else:
        change = (f"the loss still changed by {result.change:.2g} (relative) over the last "
                  f"{config.window} steps, more than the tolerance {config.tol:g}")
    warnings.warn(NotConvergedWarning(
        f"the fit stopped at {limit} before converging{who}: {change}; allow more steps",
        result.steps, result.change, config.tol, unconverged), stacklevel=2)


def _check_finite(losses: torch.Tensor, step: int, loss_fn: Callable[[], torch.Tensor],
                  config: TrainConfig) -> None:
    """Raise if a loss of the last window is not finite, naming a failed factorisation when an
    evaluation with checks finds one."""
    if bool(torch.isfinite(losses[:step]).all()):
        return
    first = int(torch.nonzero(~torch.isfinite(losses[:step]))[0]) + 1
    with torch.no_grad():
        try:
            loss_fn()
        except CholeskyError as error:
            raise CholeskyError(f"{error} (at step {first} of the fit; "
                                f"{_remedy(config)})") from None
    raise _non_finite(losses[first - 1].item(), first, config)


def _raise_if_not_finite(loss_fn: Callable[[], torch.Tensor], step: int,
                         config: TrainConfig) -> None:
    """Name the step when Pyro's validation refused a non-finite value (a NaN factor or
    distribution parameter): raise if the loss, evaluated without validation, is not finite."""
    with torch.no_grad(), pyro.validation_enabled(False), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Pyro's "Encountered NaN": the error below says it
        loss = loss_fn()
    if not bool(torch.isfinite(loss)):
        raise _non_finite(loss.item(), step, config) from None


def _non_finite(loss: float, step: int, config: TrainConfig) -> FloatingPointError:
    return FloatingPointError(f"the loss became {loss} at step {step}; {_remedy(config)}")


def _remedy(config: TrainConfig) -> str:
    """What to try after a non-finite loss: Adam's learning rate, or — L-BFGS rejects non-finite
    trial points, so its start or its data are at fault — the data."""
    if config.optimizer == "adam":
        return "try a smaller learning rate"
    return "check the data for constant targets, duplicate inputs or too few rows"


# Checkpoints --------------------------------------------------------------------------------
def save_checkpoint(path, module, optimizer, step: int, losses: torch.Tensor,
                    hooks: Sequence[PreStepHook] = (), best: BestWindow | None = None) -> None:
    """Write parameters, optimiser state, the hooks' state, the lowest window's parameters
    (``patience``) and the random state to ``path`` (+ ``path.json``)."""
    path = Path(path)
    tensors = {f"param.{k}": v.detach().contiguous() for k, v in module.state_dict().items()}
    if best is not None:
        tensors.update(best.tensors())
    for index, hook in enumerate(hooks):
        for key, value in getattr(hook, "state_dict", dict)().items():
            tensors[f"hook.{index}.{key}"] = value.detach().contiguous()
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
            "optimizer_scalars": scalars, "best": None if best is None else best.scalars()}
    atomic_write(path, save_safetensors(tensors))
    atomic_write(path.with_suffix(path.suffix + ".json"), json.dumps(meta).encode())


def load_checkpoint(path, module, optimizer, hooks: Sequence[PreStepHook] = (),
                    best: BestWindow | None = None) -> tuple[int, list[float]]:
    """Restore what :func:`save_checkpoint` wrote; returns (step, loss history)."""
    path = Path(path)
    tensors = load_file(path)
    for index, hook in enumerate(hooks):
        prefix = f"hook.{index}."
        state = {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}
        if state:
            hook.load_state_dict(state)
    meta = json.loads(path.with_suffix(path.suffix + ".json").read_text())
    if best is not None:
        best.load(tensors, meta.get("best"))
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
