"""The jitter ladder of ``gaussian/linalg.py``: relative jitter, a rung per failed batch member
only, a clear error past the last rung, NaN instead of a host check when deferred (float64) or
the same rungs climbed on the device (float32, or float64 when asked); the inverse Cholesky
factor against a dense numpy inverse; the Gram's one-product backward and the log-determinant
and solve's one-inverse backward against autograd's."""

import numpy as np
import pytest
import torch

from helpers import with_smallest_eigenvalue
from pyrogp_models.errors import CholeskyError
from pyrogp_models.gaussian.linalg import (
    JITTER_LADDER,
    cholesky,
    deferred_checks,
    gram,
    half_logdet_and_solve,
    inverse_cholesky,
    logdet_from_cholesky,
)


def reference_factor(matrix: torch.Tensor, relative_jitter: float) -> np.ndarray:
    A = matrix.numpy()
    return np.linalg.cholesky(A + relative_jitter * np.mean(np.diag(A)) * np.eye(len(A)))


def test_the_test_matrices_have_the_eigenvalue_asked_for():
    A = with_smallest_eigenvalue(-3e-5, scale=7.0).numpy()
    assert np.linalg.eigvalsh(A)[0] / np.mean(np.diag(A)) == pytest.approx(-3e-5, rel=1e-6)


def test_a_positive_definite_matrix_gets_the_first_rung_only():
    A = with_smallest_eigenvalue(0.2)
    np.testing.assert_allclose(cholesky(A).numpy(), reference_factor(A, JITTER_LADDER[0]),
                               rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("scale", [1e-6, 1.0, 1e6])
def test_each_member_climbs_to_its_own_rung_relative_to_its_scale(scale):
    """Smallest eigenvalues −0.5, −5, −50 and −500 × 1e-6 of the mean diagonal need rungs
    1e-6, 1e-5, 1e-4 and 1e-3; a positive definite member stays at the first rung."""
    needs = {0.1: 1e-6, -0.5e-6: 1e-6, -5e-6: 1e-5, -5e-5: 1e-4, -5e-4: 1e-3}
    batch = torch.stack([with_smallest_eigenvalue(value, scale=scale, seed=k)
                         for k, value in enumerate(needs)])
    assert (torch.linalg.cholesky_ex(batch)[1] > 0).tolist() == [False, True, True, True, True]
    factor = cholesky(batch.reshape(1, 5, 5, 5)).reshape(5, 5, 5)
    for k, rung in enumerate(needs.values()):
        np.testing.assert_allclose(factor[k].numpy(), reference_factor(batch[k], rung),
                                   rtol=1e-10, atol=1e-12 * np.sqrt(scale))


def test_a_higher_starting_jitter_skips_the_lower_rungs():
    A = with_smallest_eigenvalue(-5e-6)
    np.testing.assert_allclose(cholesky(A, 1e-4).numpy(), reference_factor(A, 1e-4),
                               rtol=1e-12)


def test_past_the_last_rung_the_error_names_the_matrix():
    batch = torch.stack([with_smallest_eigenvalue(0.1), with_smallest_eigenvalue(-0.05)])
    with pytest.raises(CholeskyError, match=r"Cholesky of the inducing covariance failed even "
                                            r"with relative jitter 0\.001"):
        cholesky(batch, what="inducing covariance")


def test_unchecked_and_deferred_factors_are_nan_where_they_fail():
    good, bad = with_smallest_eigenvalue(0.1), with_smallest_eigenvalue(-0.05)
    batch = torch.stack([good, bad])
    for factor in (cholesky(batch, check=False), _deferred(batch)):
        np.testing.assert_allclose(factor[0].numpy(), reference_factor(good, 1e-6), rtol=1e-12)
        assert torch.isnan(factor[1]).all()
    # without the ladder: a member that the second rung would save is NaN as well
    assert torch.isnan(cholesky(with_smallest_eigenvalue(-5e-6), check=False)).all()
    with deferred_checks(), pytest.raises(CholeskyError):
        cholesky(bad, check=True)  # an explicit check still raises


def _deferred(batch):
    with deferred_checks():
        return cholesky(batch)


def test_deferred_float32_factors_climb_the_ladder_on_the_device_as_the_checked_path_does():
    """Each member at its own rung, as the checked path (float64 reference); NaN past the last
    rung; the gradient reaches every member that factorises, and only through its own rung."""
    needs = {0.1: 1e-6, -5e-6: 1e-5, -5e-5: 1e-4, -5e-4: 1e-3}
    members = [with_smallest_eigenvalue(value, seed=k) for k, value in enumerate(needs)]
    batch = torch.stack([*members, with_smallest_eigenvalue(-0.05)]).float().requires_grad_()
    with deferred_checks():
        factor = cholesky(batch)
    for k, rung in enumerate(needs.values()):
        np.testing.assert_allclose(factor[k].detach().double().numpy(),
                                   reference_factor(batch[k].detach().double(), rung),
                                   rtol=2e-3, atol=2e-3)
    assert torch.isnan(factor[-1]).all()
    factor[:-1].diagonal(dim1=-2, dim2=-1).log().sum().backward()
    assert torch.isfinite(batch.grad[:-1]).all()


def test_a_single_matrix_climbs_the_ladder_on_the_device_without_a_host_read():
    """One matrix (no batch), float32, deferred: the rung is chosen on the device — on the meta
    device, where any read back to the host raises — and the factor is the checked path's."""
    matrix = with_smallest_eigenvalue(-5e-6).float()
    with deferred_checks():
        factor = cholesky(matrix)
        assert cholesky(matrix.to("meta")).shape == matrix.shape
    np.testing.assert_allclose(factor.double().numpy(), reference_factor(matrix.double(), 1e-5),
                               rtol=2e-3, atol=2e-3)


def test_deferred_float64_factors_climb_the_ladder_when_asked():
    """``deferred_checks(climb_ladder=True)`` (a fit whose start needs it): float64 members
    at their own rungs, the same factors as the checked path, NaN past the last rung."""
    needs = {0.1: 1e-6, -5e-6: 1e-5, -5e-4: 1e-3}
    members = [with_smallest_eigenvalue(value, seed=k) for k, value in enumerate(needs)]
    batch = torch.stack([*members, with_smallest_eigenvalue(-0.05)])
    with deferred_checks(climb_ladder=True):
        factor = cholesky(batch)
    for k, rung in enumerate(needs.values()):
        np.testing.assert_allclose(factor[k].numpy(), reference_factor(batch[k], rung),
                                   rtol=1e-10, atol=1e-12)
    assert torch.isnan(factor[-1]).all()


def test_inverse_cholesky_is_a_lower_factor_of_the_inverse():
    A = with_smallest_eigenvalue(0.05, size=6, scale=3.0)
    factor = inverse_cholesky(A).numpy()
    np.testing.assert_array_equal(np.triu(factor, 1), 0.0)
    np.testing.assert_allclose(factor @ factor.T, np.linalg.inv(A.numpy()), rtol=1e-10,
                               atol=1e-12)
    np.testing.assert_allclose(logdet_from_cholesky(torch.as_tensor(factor)).item(),
                               -np.linalg.slogdet(A.numpy())[1], rtol=1e-12)
    with pytest.raises(CholeskyError, match="precision matrix"):
        inverse_cholesky(with_smallest_eigenvalue(-0.05))


def test_the_gram_and_its_one_product_backward_match_autograd_of_the_two_operand_product():
    generator = torch.Generator().manual_seed(3)
    matrix = torch.randn(2, 7, 4, dtype=torch.float64, generator=generator, requires_grad=True)
    weights = torch.randn(2, 4, 4, dtype=torch.float64, generator=generator)  # not symmetric
    assert torch.autograd.gradcheck(gram, (matrix,))
    (expected,) = torch.autograd.grad(((matrix.mT @ matrix) * weights).sum(), matrix)
    (actual,) = torch.autograd.grad((gram(matrix) * weights).sum(), matrix)
    torch.testing.assert_close(actual, expected, rtol=1e-13, atol=1e-13)


def test_the_half_logdet_and_solve_and_its_one_inverse_backward_match_autograd_of_the_factor():
    """A = I + WᵀW from a batch of leaves W (symmetric, as every caller's matrix), two right-hand
    sides, outputs weighted by fixed non-symmetric weights: values, finite differences and
    autograd through torch's own Cholesky factor agree."""
    generator = torch.Generator().manual_seed(5)
    leaf = torch.randn(3, 9, 6, dtype=torch.float64, generator=generator, requires_grad=True)
    rhs = torch.randn(3, 6, 2, dtype=torch.float64, generator=generator, requires_grad=True)
    weights = torch.randn(3, 6, 2, dtype=torch.float64, generator=generator)
    eye = torch.eye(6, dtype=torch.float64)

    def ours(leaf, rhs):
        half_logdet, solution = half_logdet_and_solve(eye + leaf.mT @ leaf, rhs)
        return half_logdet.sum() + (solution * weights).sum()

    def autograd(leaf, rhs):
        factor = torch.linalg.cholesky(eye + leaf.mT @ leaf)
        return (factor.diagonal(dim1=-2, dim2=-1).log().sum()
                + (torch.cholesky_solve(rhs, factor) * weights).sum())

    assert torch.autograd.gradcheck(ours, (leaf, rhs))
    assert float(ours(leaf, rhs)) == pytest.approx(float(autograd(leaf, rhs)), rel=1e-13)
    for actual, expected in zip(torch.autograd.grad(ours(leaf, rhs), (leaf, rhs)),
                                torch.autograd.grad(autograd(leaf, rhs), (leaf, rhs)),
                                strict=True):
        torch.testing.assert_close(actual, expected, rtol=1e-11, atol=1e-12)
    with pytest.raises(CholeskyError, match="test matrix"):
        half_logdet_and_solve(with_smallest_eigenvalue(-0.05), rhs[0].detach(), what="test matrix")
