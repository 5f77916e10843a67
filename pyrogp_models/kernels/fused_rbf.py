"""The squared-exponential cross-covariance and its Gram statistics as a few thin products.

For the RBF kernel k(x, z) = σ² exp(−½|x − z|²/ℓ²) the weighted cross-covariance
G_nm = √w_n k(x_n, z_m) is exp(E_nm) with

    E_nm = x̃_n·z̃_m + a_n + b_m,   a_n = ½ log w_n − ½|x̃_n|²,   b_m = log σ² − ½|z̃_m|²,

x̃ = (x − c)/ℓ and z̃ = (z − c)/ℓ, i.e. E = P Qᵀ with the augmented rows P_n = [x̃_n, a_n, 1] and
Q_m = [z̃_m, 1, b_m]. One product with D + 2 columns and an in-place exponential produce G, and the
backward pass needs only G itself (∂E = ∂G ∘ G), where autograd through the distance would keep
every N×M intermediate. The shift c (the mean of the inducing inputs, held constant) leaves the
distances unchanged and keeps |x̃|² small, so the expanded square loses no accuracy.

The Gaussian bounds need only Ψ₂ = GᵀG = K_zxWK_xz and Ψ₁ = Gᵀ(√w ∘ y) = K_zxWy; their backward
is ∂G = G(∂Ψ₂ + ∂Ψ₂ᵀ) + (√w ∘ y)∂Ψ₁ᵀ. All products run as 3-D batched products on contiguous
operands (one batch dimension), which is several times faster than broadcasting matmul on CPUs.

The exponent is floored at log of the dtype's smallest normal number
(:mod:`pyrogp_models.gaussian.exp_product`).

The same machinery serves every kernel whose log is a product of thin factors (the periodic
kernel: :func:`stacked_factors`, :func:`exp_cross_covariance`), and the Gram statistics of any
weighted cross-covariance (:func:`gram_statistics`).
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from pyrogp_models.gaussian.exp_product import exp_of_product, exponent_gradients
from pyrogp_models.kernels.profiles import scaled_inputs

#: Log-weight given to padding (w = 0): its rows of G are exp of the exponent's floor
#: (≤ 3·10⁻³⁰⁸ in float64), and exactly zero in Ψ₂ and Ψ₁ (their squares underflow; v = √w y = 0).
PADDING_LOG_WEIGHT = -1.0e4


class ExpOfProduct(torch.autograd.Function):
    """G = exp(P Qᵀ) for P [B, N, R] and Q [B, M, R]; the backward keeps only P, Q and G."""

    @staticmethod
    def forward(ctx, left: torch.Tensor, right: torch.Tensor) -> torch.Tensor:
        """G = exp(left @ rightᵀ) [B, N, M] for left [B, N, R] and right [B, M, R]."""
        out = exp_of_product(left, right)
        ctx.save_for_backward(left, right, out)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: torch.Tensor):
        """With ∂E = ∂G ∘ G: the gradients ∂E Q [B, N, R] and ∂Eᵀ P [B, M, R]."""
        left, right, out = ctx.saved_tensors
        return exponent_gradients(grad * out, left, right)


def _gram_backward(G: torch.Tensor, vector: torch.Tensor, grad_gram: torch.Tensor,
                   grad_projected: torch.Tensor, needs_vector: bool
                   ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Ḡ = G(Ψ̄₂ + Ψ̄₂ᵀ) + vΨ̄₁ᵀ and v̄ = GΨ̄₁ (None unless ``needs_vector``) of (Ψ₂, Ψ₁) =
    (GᵀG, Gᵀv), all [B, ·, ·]."""
    grad_G = torch.bmm(G, grad_gram + grad_gram.mT).addcmul_(vector, grad_projected.mT)
    return grad_G, torch.bmm(G, grad_projected) if needs_vector else None


class GramOfExpOfProduct(torch.autograd.Function):
    """(Ψ₂, Ψ₁) = (GᵀG, Gᵀv) with G = exp(P Qᵀ), for P [B, N, R], Q [B, M, R], v [B, N, 1];
    G is kept for the backward pass, nothing else of size N×M."""

    @staticmethod
    def forward(ctx, left: torch.Tensor, right: torch.Tensor, vector: torch.Tensor):
        """Ψ₂ = GᵀG [B, M, M] and Ψ₁ = Gᵀv [B, M, 1], G = exp(left @ rightᵀ) [B, N, M]."""
        G = exp_of_product(left, right)
        ctx.save_for_backward(left, right, vector, G)
        return torch.bmm(G.mT, G), torch.bmm(G.mT, vector)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_gram: torch.Tensor, grad_projected: torch.Tensor):
        """∂G = G(∂Ψ₂ + ∂Ψ₂ᵀ) + v∂Ψ₁ᵀ, then through G = exp(E) as in :class:`ExpOfProduct`;
        the gradient of v is G∂Ψ₁ [B, N, 1] when asked for."""
        left, right, vector, G = ctx.saved_tensors
        grad_G, grad_vector = _gram_backward(G, vector, grad_gram, grad_projected,
                                             ctx.needs_input_grad[2])
        return (*exponent_gradients(grad_G.mul_(G), left, right), grad_vector)


class GramStatistics(torch.autograd.Function):
    """(Ψ₂, Ψ₁) = (GᵀG, Gᵀv) for any weighted cross-covariance G [B, N, M] and v [B, N, 1]:
    Ḡ = G(Ψ̄₂ + Ψ̄₂ᵀ) + vΨ̄₁ᵀ in one product, where autograd would form the two uses of G
    separately and add them."""

    @staticmethod
    def forward(ctx, G: torch.Tensor, vector: torch.Tensor):
        """Ψ₂ = GᵀG [B, M, M] and Ψ₁ = Gᵀv [B, M, 1]."""
        ctx.save_for_backward(G, vector)
        return torch.bmm(G.mT, G), torch.bmm(G.mT, vector)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_gram: torch.Tensor, grad_projected: torch.Tensor):
        """Ḡ = G(Ψ̄₂ + Ψ̄₂ᵀ) + vΨ̄₁ᵀ; v̄ = GΨ̄₁ when asked for."""
        G, vector = ctx.saved_tensors
        return _gram_backward(G, vector, grad_gram, grad_projected, ctx.needs_input_grad[1])


def gram_statistics(G: torch.Tensor, vector: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Ψ₂ = GᵀG [*batch, M, M] and Ψ₁ = Gᵀv [*batch, M] for G [*batch, N, M] and v [*batch, N]
    (broadcastable batch), as 3-D products (:class:`GramStatistics`)."""
    batch = _broadcast_batch(G.shape[:-2], vector.shape[:-1])
    N, M = G.shape[-2:]
    gram, projected = GramStatistics.apply(
        G.expand(*batch, N, M).reshape(-1, N, M),
        vector.expand(*batch, N).reshape(-1, N, 1))
    return gram.reshape(*batch, M, M), projected.reshape(*batch, M)


def half_log_weights(weights: torch.Tensor) -> torch.Tensor:
    """½ log w_n [*batch, N], padding (w = 0) at :data:`PADDING_LOG_WEIGHT`."""
    tiny = torch.finfo(weights.dtype).tiny
    return 0.5 * torch.where(weights > 0, weights.clamp_min(tiny).log(), PADDING_LOG_WEIGHT)


def stacked_factors(left_parts: list[torch.Tensor], right_parts: list[torch.Tensor]
                    ) -> tuple[torch.Tensor, torch.Tensor, tuple[int, ...]]:
    """P [B, N, R] and Q [B, M, R] from column blocks [*batch, N, r] and [*batch, M, r] of
    broadcastable batch shapes, and the broadcast batch shape (B its size)."""
    batch = _broadcast_batch(*(part.shape[:-2] for part in left_parts + right_parts))
    N, M = left_parts[0].shape[-2], right_parts[0].shape[-2]
    left = torch.cat([part.expand(*batch, N, part.shape[-1]) for part in left_parts], -1)
    right = torch.cat([part.expand(*batch, M, part.shape[-1]) for part in right_parts], -1)
    return left.reshape(-1, N, left.shape[-1]), right.reshape(-1, M, right.shape[-1]), batch


def exp_cross_covariance(left: torch.Tensor, right: torch.Tensor, batch: tuple[int, ...]
                         ) -> torch.Tensor:
    """exp(P Qᵀ) [*batch, N, M] from :func:`stacked_factors` (:class:`ExpOfProduct`)."""
    G = ExpOfProduct.apply(left, right)
    return G.reshape(*batch, *G.shape[-2:])


def _augmented_factors(X, Z, lengthscale, variance, weights):
    """P [B, N, D+2] and Q [B, M, D+2] with exp(PQᵀ) = √w ∘ k(X, Z), and the batch shape."""
    X_scaled, Z_scaled = scaled_inputs(X, Z, lengthscale)
    a = -0.5 * X_scaled.square().sum(-1)
    if weights is not None:
        a = a + half_log_weights(weights)
    b = variance.log().unsqueeze(-1) - 0.5 * Z_scaled.square().sum(-1)
    return stacked_factors([X_scaled, a.unsqueeze(-1), torch.ones_like(a).unsqueeze(-1)],
                           [Z_scaled, torch.ones_like(b).unsqueeze(-1), b.unsqueeze(-1)])


def rbf_weighted_cross_covariance(X: torch.Tensor, Z: torch.Tensor, lengthscale: torch.Tensor,
                                  variance: torch.Tensor, weights: torch.Tensor | None = None
                                  ) -> torch.Tensor:
    """G_nm = √w_n σ² exp(−½|x_n − z_m|²/ℓ²), batched; [*batch, N, M].

    Args:
        X: [*batch, N, D] (broadcastable batch), Z: [*batch, M, D].
        lengthscale: [*batch, D] or [*batch, 1]; variance: [*batch].
        weights: non-negative point weights [*batch, N] (broadcastable); zero marks padding.
    """
    return exp_cross_covariance(*_augmented_factors(X, Z, lengthscale, variance, weights))


def rbf_exponent_factors(X: torch.Tensor, Z: torch.Tensor, lengthscale: torch.Tensor,
                         variance: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """P [N, D+2] and Q [M, D+2] with exp(P Qᵀ) = σ² exp(−½|x_n − z_m|²/ℓ²) (one kernel:
    X [N, D], Z [M, D], lengthscale [D] or [1], variance [])."""
    left, right, _ = _augmented_factors(X, Z, lengthscale, variance, None)
    return left.squeeze(0), right.squeeze(0)


def rbf_weighted_gram(X: torch.Tensor, Z: torch.Tensor, lengthscale: torch.Tensor,
                      variance: torch.Tensor, weights: torch.Tensor, y: torch.Tensor
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """Ψ₂ = K_zxWK_xz [*batch, M, M] and Ψ₁ = K_zxWy [*batch, M] for the RBF kernel, with the
    arguments of :func:`rbf_weighted_cross_covariance` and targets y [*batch, N]."""
    left, right, batch = _augmented_factors(X, Z, lengthscale, variance, weights)
    vector = (weights.sqrt() * y).expand(*batch, left.shape[-2])
    gram, projected = GramOfExpOfProduct.apply(left, right,
                                               vector.reshape(-1, left.shape[-2], 1))
    M = right.shape[-2]
    return gram.reshape(*batch, M, M), projected.reshape(*batch, M)


def _broadcast_batch(*shapes: torch.Size) -> tuple[int, ...]:
    """Broadcast batch shapes (plain Python; torch.broadcast_shapes costs more than the kernel
    for small problems)."""
    width = max(len(shape) for shape in shapes)
    padded = [(1,) * (width - len(shape)) + tuple(shape) for shape in shapes]
    return tuple(max(sizes) for sizes in zip(*padded, strict=True))
