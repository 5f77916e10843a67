"""The inner layer of a multitask deep GP: shared and private latent processes (Boustati et al.,
eq. 1) and the latent space λ^t they span.

A :class:`ProcessBlock` is K processes of W outputs each — once for all tasks (the shared g_i) or
once per task (the private h_j^t) — as one :class:`~pyrogp_models.layers.SparseGPLayer` with
batch ([T,] K, W): every output an independent GP; the outputs of a process share its kernel
(:mod:`.kernel`) and inducing inputs; a fixed linear mean m(x) = xW. A shared process has M
inducing inputs like a private one, so its cost is linear in the number of tasks. Inputs arrive
in the per-task layout [T', P, D] (T' = T, or 1 for inputs common to all tasks): a shared block
evaluates every slot, a private block only its own task's.

Latent spaces (how λ^t is made from the blocks' outputs, given per-point draws of them):

- :class:`ConcatenatedLatents` (mMDGP, sMDGP, iDGP): λ^t = concat({g_i}, {h_j^t}) of width
  D^t = I·D^G + J·D^H (footnote 1);
- :class:`CoregionalisedLatents` (cMDGP): Q shared latent GPs u_q mixed per task,
  λ^t(x) = m(x) + A^t u(x) with A^t [W, Q] — every latent dimension an LMC/ICM GP.

The doubly-stochastic estimator draws the blocks' outputs at every point from their variational
marginals, b = μ + √(σ² + σ_w²) ε (Salimbeni & Deisenroth 2017, eq. 7; σ_w² the inner white
noise), so no N×N or cross-task matrix is formed; ``conditional`` gives their law given whitened
inducing draws, for ``pyro.infer.Predictive``.
"""

from __future__ import annotations

import torch
from pyro.nn import PyroModule, PyroParam

from pyrogp_models.layers import SparseGPLayer
from pyrogp_models.models.multitask.data import DistinctInputs
from pyrogp_models.models.multitask.kernel import process_kernel


def linear_mean(X: torch.Tensor, weights: torch.Tensor | None) -> torch.Tensor | float:
    """m(x) = xW for the fixed weights W [D, W] (0 without weights)."""
    return 0.0 if weights is None else X @ weights


class ProcessBlock(PyroModule):
    """K sparse GPs of W outputs each, shared by all tasks or one set per task.

    Args:
        inducing: initial Z [K, M, D] (shared) or [T, K, M, D] (per task).
        width: W, the outputs of every process.
        lengthscale, variance, ard: initial Matérn-5/2 hyperparameters (lengthscale None:
            :func:`.kernel.initial_lengthscale`).
        mean_weights: the fixed linear mean [D, W] (None: zero mean).
        q_scale, jitter, learn_inducing: as for :class:`SparseGPLayer`.
    """

    def __init__(self, inducing: torch.Tensor, width: int, *, lengthscale: float | None,
                 variance: float, ard: bool, mean_weights: torch.Tensor | None,
                 q_scale: float, jitter: float, learn_inducing: bool):
        super().__init__()
        *groups, _, input_dim = inducing.shape
        kernel = process_kernel(input_dim, (*groups, 1), ard=ard, lengthscale=lengthscale,
                                variance=variance, like=inducing)
        self.layer = SparseGPLayer(kernel, inducing.unsqueeze(-3), (*groups, width),
                                   learn_inducing=learn_inducing, jitter=jitter,
                                   q_scale=q_scale)
        self.per_task = len(groups) == 2
        self.num_processes, self.width = groups[-1], width
        self.register_buffer("mean_weights", mean_weights)

    @property
    def output_width(self) -> int:
        return self.num_processes * self.width

    def marginals(self, X: torch.Tensor, distinct: DistinctInputs | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
        """q marginals of every output at X [T', P, D] (Hensman et al. 2015, whitened): mean
        and variance [T'', P, K·W], T'' = T for private processes, else T'. ``distinct``: X's
        distinct inputs, at which shared processes are evaluated once each."""
        if distinct is None or self.per_task:
            mean, var = self.layer.marginals(self._points(X))
        else:
            mean, var = self.layer.marginals(self._points(distinct.X.unsqueeze(0)))
            mean, var = distinct.to_slots(mean), distinct.to_slots(var)
        return self._arrange(mean, X) + self._mean(X), self._arrange(var, X)

    def conditional(self, whitened: torch.Tensor, X: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Law of every output at X [T', P, D] given whitened inducing draws [..., *batch, M]:
        mean [..., T'', P, K·W] and variance [T'', P, K·W]."""
        mean, var = self.layer.conditional_on(whitened, self._points(X))
        var = var.expand(*var.shape[:-2], self.width, var.shape[-1])
        return self._arrange(mean, X) + self._mean(X), self._arrange(var, X)

    def kl(self) -> torch.Tensor:
        """Σ over processes and outputs of KL[q(v) ‖ N(0, I)] (a scalar; eq. 9's H and G
        terms)."""
        return self.layer.kl().sum()

    def _points(self, X: torch.Tensor) -> torch.Tensor:
        """X [T', P, D] as the layer's inputs: [T', 1, 1, P, D] per task, else all T'·P
        points at once [1, 1, T'·P, D]."""
        if self.per_task:
            return X[:, None, None]
        return X.reshape(1, 1, -1, X.shape[-1])

    def _arrange(self, values: torch.Tensor, X: torch.Tensor) -> torch.Tensor:
        """The layer's [..., (T,) K, W, n] → [..., T, P, K·W]."""
        if not self.per_task:
            values = values.unflatten(-1, X.shape[:2]).movedim(-2, -4)   # [..., T', K, W, P]
        return values.movedim(-1, -3).flatten(-2)

    def _mean(self, X: torch.Tensor) -> torch.Tensor | float:
        mean = linear_mean(X, self.mean_weights)
        if isinstance(mean, float):
            return mean
        return mean.unsqueeze(-2).expand(*mean.shape[:-1], self.num_processes,
                                         self.width).flatten(-2)


class LatentSpace(PyroModule):
    """The blocks of an inner layer; a subclass maps their outputs b to λ^t (``transform``)."""

    #: Noise columns (block outputs) that belong to processes shared by all tasks: they are tied
    #: across tasks when all tasks are predicted at common inputs.
    shared_width: int

    def blocks(self) -> list[tuple[str, ProcessBlock]]:
        """The process blocks that span the latent space, with their names."""
        raise NotImplementedError

    @property
    def noise_width(self) -> int:
        """Outputs of all blocks: the standard normals one draw of the latent space needs."""
        return sum(block.output_width for _, block in self.blocks())

    def marginals(self, X: torch.Tensor, distinct: DistinctInputs | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
        """q marginals of the blocks' outputs at X [T', P, D] (with its ``distinct`` inputs):
        [T, P, noise_width] each."""
        return _concatenate([block.marginals(X, distinct) for _, block in self.blocks()])

    def conditional(self, whitened: dict[str, torch.Tensor], X: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The blocks' outputs at X given whitened inducing draws (by block name)."""
        return _concatenate([block.conditional(whitened[name], X)
                             for name, block in self.blocks()])

    def kl(self) -> torch.Tensor:
        """Σ of the blocks' KL terms (a scalar)."""
        return sum(block.kl() for _, block in self.blocks())

    def transform(self, outputs: torch.Tensor, X: torch.Tensor) -> torch.Tensor:
        """λ [..., T, P, D^t] from draws of the blocks' outputs [..., T', P, noise_width]."""
        raise NotImplementedError

    def parts(self, latent: torch.Tensor) -> dict[str, torch.Tensor]:
        """λ by its named parts (e.g. shared and private columns)."""
        raise NotImplementedError


def _concatenate(moments: list[tuple[torch.Tensor, torch.Tensor]]
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Concatenate (mean, variance) pairs along the last dimension, broadcasting the others."""
    def cat(values: list[torch.Tensor]) -> torch.Tensor:
        leading = torch.broadcast_shapes(*(value.shape[:-1] for value in values))
        return torch.cat([value.expand(*leading, value.shape[-1]) for value in values], -1)
    return cat([mean for mean, _ in moments]), cat([var for _, var in moments])


class ConcatenatedLatents(LatentSpace):
    """λ^t = concat(g_1 … g_I, h_1^t … h_J^t) (Boustati et al., Sec. 2.2): mMDGP (both),
    sMDGP (shared only) and iDGP (private only)."""

    def __init__(self, shared: ProcessBlock | None, private: ProcessBlock | None):
        super().__init__()
        self.shared = shared
        self.private = private
        self.shared_width = 0 if shared is None else shared.output_width

    def blocks(self) -> list[tuple[str, ProcessBlock]]:
        return [(name, block) for name, block in (("shared", self.shared),
                                                   ("private", self.private))
                if block is not None]

    @property
    def width(self) -> int:
        return self.noise_width

    def transform(self, outputs: torch.Tensor, X: torch.Tensor) -> torch.Tensor:
        return outputs

    def parts(self, latent: torch.Tensor) -> dict[str, torch.Tensor]:
        split = latent.split([block.output_width for _, block in self.blocks()], -1)
        return {name: part for (name, _), part in zip(self.blocks(), split, strict=True)}


class CoregionalisedLatents(LatentSpace):
    """λ^t(x) = m(x) + A^t u(x): Q shared latent GPs u (one block of zero mean) linearly mixed
    with task-specific coefficients A^t [W, Q] (cMDGP, Sec. 2.3).

    Args:
        processes: the block of the u_q (shared, Q outputs in all).
        mixing: initial A [T, W, Q].
        mean_weights: the fixed linear mean [D, W] (None: zero mean).
    """

    def __init__(self, processes: ProcessBlock, mixing: torch.Tensor,
                 mean_weights: torch.Tensor | None):
        super().__init__()
        self.coregional = processes
        self.mixing = PyroParam(mixing)
        self.register_buffer("mean_weights", mean_weights)
        self.shared_width = processes.output_width

    def blocks(self) -> list[tuple[str, ProcessBlock]]:
        return [("coregional", self.coregional)]

    @property
    def width(self) -> int:
        return self.mixing.shape[-2]

    def transform(self, outputs: torch.Tensor, X: torch.Tensor) -> torch.Tensor:
        return outputs @ self.mixing.mT + linear_mean(X, self.mean_weights)

    def parts(self, latent: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"latent": latent}
