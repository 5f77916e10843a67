"""L-BFGS for a sum of independent objectives: one memory and one step size per member.

The local sparse GPs of K partitions are K independent problems min_θk f_k(θ_k) evaluated as
one batch. L-BFGS on the sum Σ_k f_k would mix them: its curvature pairs and its line search
are shared, so one badly scaled partition slows all others. Here every member k keeps its own
history of curvature pairs (s_i, y_i) (Nocedal & Wright 2006, Alg. 7.4, the two-loop recursion,
with the initial scaling γ_k = s_kᵀy_k / y_kᵀy_k of eq. 7.20) and its own step length α_k.

Each iteration evaluates every member once, at its trial point θ_k + α_k d_k, with its
gradient; a member accepts the trial if it satisfies the Armijo condition
f_k(θ_k + α_k d_k) ≤ f_k(θ_k) + c₁ α_k ∇f_kᵀd_k + ε|f_k|, or — where rounding hides the
decrease — Hager & Zhang's approximate Wolfe conditions (2005, eq. 23: f may rise by √ε|f|
while the slope along d_k shrinks to between σ and 1 − 2δ of its value). An accepted step gives
a new curvature pair (kept if s_kᵀy_k > 0); a rejected one keeps θ_k and tries the minimiser of
the quadratic through f(θ_k), its slope and f at the rejected step, within [α_k/10, α_k/2], at
the next iteration (a backtracking line search spread over iterations); after
:data:`RESTART` rejections in a row the member forgets its pairs. The decisions are
``torch.where`` masks, so nothing is read back to the host and one iteration costs exactly one
batched evaluation with its gradient, like one Adam step.

Members that pass the trainer's convergence test are frozen (:meth:`BatchedLBFGS.freeze`), so a
member's path and end point do not depend on the other members of its batch. Where the model
can evaluate its objective more precisely (:meth:`BatchedLBFGS.refine`), the trainer ends on
:meth:`BatchedLBFGS.pinned`: the decrease a quasi-Newton step predicts, −∇fᵀd ≈ 2(f − f*), is
at most ε^0.85·max(1, |f|). That pins each member at its optimum to rounding, so fits of the same
partition batched with different others (in process, on Dask workers) agree to ~1e-8, where a
test on the change of f alone leaves them ~1e-3 apart.

Parameters are the model's tensors with a leading member dimension ([K, ...] each), or any
tensors for a single member; the objective returns f [K] to minimise.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

#: Armijo constant c₁ of the sufficient-decrease test.
ARMIJO = 1e-4
#: δ and σ of Hager & Zhang's approximate Wolfe conditions (2005, eq. 23).
ARMIJO_APPROXIMATE, CURVATURE = 0.1, 0.9
#: Consecutive rejected steps after which a member forgets its curvature pairs; twice as many
#: mean its objective's rounding hides any further decrease (the member is stalled).
RESTART = 10
#: A member is pinned when −∇fᵀd ≤ ε^PINNED·max(1, |f|) (ε of its dtype: 5e-14 in float64).
PINNED = 0.85
#: Curvature pairs kept per member: up to four per parameter (at least MIN_HISTORY), so that near
#: the optimum the steps are quasi-Newton steps (10 pairs for 43 parameters took 500 iterations
#: short of pinning a CO2 fit that 50 pin in 380; 13 pairs for 13 parameters need twice the
#: iterations of 50). Memory: 2·history·P numbers per member.
HISTORY, MIN_HISTORY = 50, 10


class MemberBlock:
    """Parameters of K independent members ([K, ...] each, or any shapes when K = 1) and their
    objective f(·) → [K] (minimised).

    Up to ``history`` pairs per member; state lives on the parameters' device."""

    def __init__(self, parameters: Sequence[torch.nn.Parameter],
                 objective: Callable[[], torch.Tensor], history: int = HISTORY):
        self.parameters = [p for p in parameters if p.requires_grad]
        self.objective = objective
        reference = self.parameters[0]
        with torch.no_grad():
            self.members = objective().numel()
        if self.members > 1 and any(p.shape[:1] != (self.members,) for p in self.parameters):
            raise ValueError(f"every parameter of a batched L-BFGS block of {self.members} "
                             "members needs that leading (member) dimension")
        self.max_history = history
        self.active = torch.ones(self.members, dtype=torch.bool, device=reference.device)
        self._forget()

    def _forget(self) -> None:
        """Fresh memory for the current parameters: no curvature pair, unit step lengths."""
        reference = self.parameters[0]
        self.size = sum(p.numel() for p in self.parameters) // self.members
        self.history = min(self.max_history, max(4 * self.size, MIN_HISTORY))
        like = dict(dtype=reference.dtype, device=reference.device)
        self.s = torch.zeros(self.history, self.members, self.size, **like)
        self.y = torch.zeros_like(self.s)
        self.rho = torch.zeros(self.history, self.members, **like)  # 0: no pair stored
        self.step_length = torch.ones(self.members, **like)
        self.rejections = torch.zeros(self.members, dtype=torch.long, device=reference.device)
        self.value: torch.Tensor | None = None
        self.gradient: torch.Tensor | None = None

    # Flat views -------------------------------------------------------------------------------
    def flat(self) -> torch.Tensor:
        """θ as [K, P]."""
        return torch.cat([p.detach().reshape(self.members, -1) for p in self.parameters], 1)

    def assign(self, flat: torch.Tensor) -> None:
        """Write ``flat`` [K, P] (one row of P numbers per member) into the parameters."""
        start = 0
        with torch.no_grad():
            for p in self.parameters:
                size = p.numel() // self.members
                p.copy_(flat[:, start:start + size].reshape(p.shape))
                start += size

    def evaluate(self) -> tuple[torch.Tensor, torch.Tensor]:
        """f [K] and ∇f [K, P] at the current parameters (members are independent, so the
        gradient of Σ_k f_k holds every member's own gradient)."""
        value = self.objective()
        grads = torch.autograd.grad(value.sum(), self.parameters)
        return value.detach(), torch.cat([g.reshape(self.members, -1) for g in grads], 1)

    # One iteration ----------------------------------------------------------------------------
    def direction(self, gradient: torch.Tensor) -> torch.Tensor:
        """d = −H∇f per member by the two-loop recursion over its stored pairs (steepest
        descent, scaled to unit length, for members without a pair)."""
        q = gradient.clone()
        alphas = []
        for i in reversed(range(self.history)):
            alpha = self.rho[i] * (self.s[i] * q).sum(-1)
            q = q - alpha.unsqueeze(-1) * self.y[i]
            alphas.append(alpha)
        latest = self.history - 1
        sy = (self.s[latest] * self.y[latest]).sum(-1)
        yy = self.y[latest].square().sum(-1)
        has_pair = self.rho[latest] > 0
        gamma = torch.where(has_pair, sy / yy.clamp_min(torch.finfo(yy.dtype).tiny),
                            1.0 / gradient.norm(dim=-1).clamp_min(1e-12))
        r = gamma.unsqueeze(-1) * q
        for i, alpha in zip(range(self.history), reversed(alphas), strict=True):
            beta = self.rho[i] * (self.y[i] * r).sum(-1)
            r = r + (alpha - beta).unsqueeze(-1) * self.s[i]
        direction = -r
        descent = (direction * gradient).sum(-1) < 0
        return torch.where(descent.unsqueeze(-1), direction,
                           -gradient / gradient.norm(dim=-1, keepdim=True).clamp_min(1e-12))

    def step(self) -> torch.Tensor:
        """One iteration for every member; returns f [K] at the (possibly unchanged) θ."""
        if self.value is None:
            self.value, self.gradient = self.evaluate()
        theta, value, gradient = self.flat(), self.value, self.gradient
        direction = self.direction(gradient)
        trial = theta + self.step_length.unsqueeze(-1) * direction
        self.assign(trial)
        trial_value, trial_gradient = self.evaluate()
        slope = (gradient * direction).sum(-1)
        trial_slope = (trial_gradient * direction).sum(-1)
        eps = torch.finfo(value.dtype).eps
        armijo = trial_value <= value + ARMIJO * self.step_length * slope + eps * value.abs()
        approximate_wolfe = ((trial_value <= value + eps ** 0.5 * value.abs())
                             & (trial_slope >= CURVATURE * slope)
                             & (trial_slope <= (2 * ARMIJO_APPROXIMATE - 1) * slope))
        accept = (self.active & torch.isfinite(trial_value)
                  & torch.isfinite(trial_gradient).all(-1) & (armijo | approximate_wolfe))
        s, y = trial - theta, trial_gradient - gradient
        sy = (s * y).sum(-1)
        store = accept & (sy > 1e-12 * s.norm(dim=-1) * y.norm(dim=-1))
        self.s = torch.where(store[None, :, None], torch.cat([self.s[1:], s[None]]), self.s)
        self.y = torch.where(store[None, :, None], torch.cat([self.y[1:], y[None]]), self.y)
        self.rho = torch.where(store[None], torch.cat([self.rho[1:], (1.0 / sy)[None]]),
                               self.rho)
        self.assign(torch.where(accept.unsqueeze(-1), trial, theta))
        self.value = torch.where(accept, trial_value, value)
        self.gradient = torch.where(accept.unsqueeze(-1), trial_gradient, gradient)
        self.step_length = torch.where(accept, torch.ones_like(self.step_length),
                                       self._backtrack(value, slope, trial_value))
        self.rejections = torch.where(accept | ~self.active, 0, self.rejections + 1)
        restart = self.rejections == RESTART  # forget the memory once, then try again
        self.rho = torch.where(restart[None], 0.0, self.rho)
        self.step_length = torch.where(restart, 1.0, self.step_length)
        return self.value

    def _backtrack(self, value, slope, trial_value) -> torch.Tensor:
        """The next trial step after a rejected one: the minimiser of the quadratic through
        f(θ), its slope and f at the rejected step α, kept within [α/10, α/2]."""
        alpha = self.step_length
        curvature = trial_value - value - slope * alpha
        quadratic = -slope * alpha.square() / (2 * curvature)
        quadratic = torch.where(torch.isfinite(quadratic) & (curvature > 0), quadratic,
                                0.5 * alpha)
        return torch.minimum(torch.maximum(quadratic, 0.1 * alpha), 0.5 * alpha)

    def predicted_decrease(self) -> torch.Tensor:
        """−∇fᵀd [K] at the current point: the decrease that the quasi-Newton step d = −H∇f
        predicts, ≈ 2(f − f*) near a minimum (so it bounds how far the parameters are from it
        along every direction the objective depends on)."""
        if self.value is None:
            self.value, self.gradient = self.evaluate()
        return -(self.gradient * self.direction(self.gradient)).sum(-1)

    def refine(self, objective: Callable[[], torch.Tensor]) -> None:
        """Continue on ``objective`` (the same function, computed more precisely) with every
        member active."""
        self.objective = objective
        self.active = torch.ones_like(self.active)
        self.rejections.zero_()
        self.value = self.gradient = None

    def hold(self, parameters: Sequence[torch.nn.Parameter]) -> None:
        """Go on without ``parameters`` (they keep their values), forgetting the curvature pairs,
        which spanned them; frozen members stay frozen. A block left with no parameter keeps
        them all."""
        held = {id(p) for p in parameters}
        kept = [p for p in self.parameters if id(p) not in held]
        if kept and len(kept) < len(self.parameters):
            self.parameters = kept
            self._forget()

    # State (checkpoints) ----------------------------------------------------------------------
    def state(self) -> dict[str, torch.Tensor]:
        """The curvature pairs s, y [K, memory, P], ρ [K, memory], step lengths [K] and the
        active-member mask [K], for a checkpoint."""
        return {"s": self.s, "y": self.y, "rho": self.rho, "step_length": self.step_length,
                "active": self.active}

    def load_state(self, state: dict[str, torch.Tensor]) -> None:
        """Restore what :meth:`state` returned; the next step evaluates afresh. Pairs over other
        parameters than this block's (a checkpoint taken after :meth:`hold`) are forgotten."""
        self.active = state["active"]
        if state["s"].shape[-1] != self.size:
            self._forget()
            return
        self.s, self.y, self.rho = state["s"], state["y"], state["rho"]
        self.step_length = state["step_length"]
        self.value = self.gradient = None


class BatchedLBFGS:
    """The optimiser of :func:`pyrogp_models.inference.trainer.train` for models that declare
    independent members (``batched_objectives()``: a list of (parameters, objective) pairs, one per
    block of members). ``step()`` takes one iteration of every block and returns the summed f."""

    def __init__(self, blocks: Sequence[tuple[Sequence[torch.nn.Parameter],
                                              Callable[[], torch.Tensor]]], history: int = HISTORY):
        self.blocks = [MemberBlock(params, objective, history) for params, objective in blocks]

    def step(self) -> torch.Tensor:
        """One iteration of every block (one batched evaluation with its gradient); returns the
        sum over members of the objective at the points evaluated (a scalar)."""
        return sum(block.step().sum() for block in self.blocks)

    def objective_values(self) -> torch.Tensor:
        """f of every member (all blocks concatenated), evaluated afresh at the current
        parameters without gradient (:meth:`member_values` returns the last step's)."""
        with torch.no_grad():
            return torch.cat([block.objective().detach().reshape(-1) for block in self.blocks])

    def member_values(self) -> list[torch.Tensor]:
        """f [K] of every block at the current parameters (after at least one step)."""
        return [block.value for block in self.blocks]

    def near(self, tolerance: float | None = None) -> torch.Tensor:
        """Which members (all blocks concatenated) are within ``tolerance`` of their minimum:
        the predicted decrease −∇fᵀd ≈ 2(f − f*) is at most ``tolerance``·max(1, |f|) (default
        ε^:data:`PINNED`: pinned to rounding), or rounding hides any further decrease
        (2·:data:`RESTART` rejections in a row), or the member is frozen (judged so already:
        a :meth:`hold` forgets the curvature pairs that showed it)."""
        flags = []
        for block in self.blocks:
            decrease = block.predicted_decrease()
            bound = torch.finfo(decrease.dtype).eps ** PINNED if tolerance is None else tolerance
            flags.append((decrease <= bound * block.value.abs().clamp_min(1.0))
                         | (block.rejections >= 2 * RESTART) | ~block.active)
        return torch.cat(flags)

    def pinned(self) -> torch.Tensor:
        """Which members sit at their minimum to rounding (:meth:`near` with its default)."""
        return self.near()

    def refine(self, blocks: Sequence[tuple[Sequence[torch.nn.Parameter],
                                            Callable[[], torch.Tensor]]]) -> None:
        """Go on with every member active on ``blocks``' objectives: the same parameters and
        functions, evaluated more precisely."""
        for block, (_, objective) in zip(self.blocks, blocks, strict=True):
            block.refine(objective)

    def hold(self, parameters: Sequence[torch.nn.Parameter]) -> None:
        """Go on with ``parameters`` held where they are (:meth:`MemberBlock.hold`)."""
        for block in self.blocks:
            block.hold(parameters)

    def freeze(self, converged: torch.Tensor) -> None:
        """Stop the members marked in ``converged`` (all blocks' members concatenated): each
        member then stops on its own test, so its result does not depend on which others share
        its batch."""
        start = 0
        for block in self.blocks:
            block.active = block.active & ~converged[start:start + block.members]
            start += block.members

    def state_dict(self) -> dict:
        """In the layout of a torch optimiser's state dict, for the trainer's checkpoints."""
        return {"state": {index: block.state() for index, block in enumerate(self.blocks)},
                "param_groups": []}

    def load_state_dict(self, state: dict) -> None:
        """Restore every block's memory, step lengths and frozen members (a checkpoint)."""
        for index, block in enumerate(self.blocks):
            block.load_state(state["state"][index])
