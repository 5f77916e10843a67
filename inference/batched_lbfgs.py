"""L-BFGS for a sum of independent objectives: one memory and one step size per member.

The local sparse GPs of K partitions are K independent problems min_θk f_k(θ_k) evaluated as
one batch. L-BFGS on the sum Σ_k f_k would mix them: its curvature pairs and its line search
are shared, so one badly scaled partition slows all others. Here every member k keeps its own
history of curvature pairs (s_i, y_i) (Nocedal & Wright 2006, Alg. 7.4, the two-loop recursion,
with the initial scaling γ_k = s_kᵀy_k / y_kᵀy_k of eq. 7.20) and its own step length α_k.

Each iteration evaluates every member once, at its trial point θ_k + α_k d_k, with its
gradient; a member accepts the trial if it satisfies the Armijo condition
f_k(θ_k + α_k d_k) ≤ f_k(θ_k) + c₁ α_k ∇f_kᵀd_k (and is finite), which then also gives it a new
curvature pair (kept if s_kᵀy_k > 0). A member that rejects keeps θ_k and halves α_k for the
next iteration (a backtracking line search spread over iterations); one that accepts tries
α_k = 1 again. The decisions are ``torch.where`` masks, so nothing is read back to the host
and one iteration costs exactly one batched evaluation with its gradient, like one Adam step.
Members that pass the trainer's convergence test are frozen (:meth:`BatchedLBFGS.freeze`), so a
member's path and end point do not depend on the other members of its batch.

Parameters are the model's tensors with a leading member dimension ([K, ...] each), or any
tensors for a single member; the objective returns f [K] to minimise.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

#: Armijo constant c₁ of the sufficient-decrease test.
ARMIJO = 1e-4


class MemberBlock:
    """Parameters of K independent members ([K, ...] each, or any shapes when K = 1) and their
    objective f(·) → [K] (minimised).

    ``history`` pairs per member; state lives on the parameters' device."""

    def __init__(self, parameters: Sequence[torch.nn.Parameter],
                 objective: Callable[[], torch.Tensor], history: int = 10):
        self.parameters = [p for p in parameters if p.requires_grad]
        self.objective = objective
        self.history = history
        reference = self.parameters[0]
        with torch.no_grad():
            self.members = objective().numel()
        if self.members > 1 and any(p.shape[:1] != (self.members,) for p in self.parameters):
            raise ValueError(f"every parameter of a batched L-BFGS block of {self.members} "
                             "members needs that leading (member) dimension")
        self.size = sum(p.numel() for p in self.parameters) // self.members
        like = dict(dtype=reference.dtype, device=reference.device)
        self.s = torch.zeros(history, self.members, self.size, **like)
        self.y = torch.zeros_like(self.s)
        self.rho = torch.zeros(history, self.members, **like)  # 0: no pair stored
        self.step_length = torch.ones(self.members, **like)
        self.active = torch.ones(self.members, dtype=torch.bool, device=reference.device)
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
        accept = (self.active & torch.isfinite(trial_value)
                  & torch.isfinite(trial_gradient).all(-1)
                  & (trial_value <= value + ARMIJO * self.step_length * slope))
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
                                       0.5 * self.step_length)
        return self.value

    # State (checkpoints) ----------------------------------------------------------------------
    def state(self) -> dict[str, torch.Tensor]:
        """The curvature pairs s, y [K, memory, P], ρ [K, memory], step lengths [K] and the
        active-member mask [K], for a checkpoint."""
        return {"s": self.s, "y": self.y, "rho": self.rho, "step_length": self.step_length,
                "active": self.active}

    def load_state(self, state: dict[str, torch.Tensor]) -> None:
        """Restore what :meth:`state` returned; the next step evaluates afresh."""
        self.s, self.y, self.rho = state["s"], state["y"], state["rho"]
        self.step_length, self.active = state["step_length"], state["active"]
        self.value = self.gradient = None


class BatchedLBFGS:
    """The optimiser of :func:`inference.trainer.train` for models that declare independent
    members (``batched_objectives()``: a list of (parameters, objective) pairs, one per block
    of members). ``step()`` takes one iteration of every block and returns the summed f."""

    def __init__(self, blocks: Sequence[tuple[Sequence[torch.nn.Parameter],
                                              Callable[[], torch.Tensor]]], history: int = 10):
        self.blocks = [MemberBlock(params, objective, history) for params, objective in blocks]

    def step(self) -> torch.Tensor:
        """One iteration of every block (one batched evaluation with its gradient); returns the
        sum over members of the objective at the points evaluated (a scalar)."""
        return sum(block.step().sum() for block in self.blocks)

    def member_values(self) -> list[torch.Tensor]:
        """f [K] of every block at the current parameters (after at least one step)."""
        return [block.value for block in self.blocks]

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
