"""The authors' ensemble bound (Recyclable GPs: ``EnsembleGP`` of pmorenoz/RecyclableGP) on the
same modules, for a side-by-side timing in one process.

Nothing of their code is copied here: :func:`load` imports it from a checkout the user names
(``meta_gp.py --authors PATH``); without one the comparison is skipped. Their code predates
torch 2: it calls ``torch.solve(B, A)`` (removed) and ``torch.cholesky`` (deprecated), so both
are replaced by ``torch.linalg`` equivalents while it runs, and the GPy classes their model files
import for prediction (never called here) are stubbed. Their kernel adds jitter only when a
Cholesky factor of K(X) fails, which K(Z_*, Z_*) in the ensemble bound never asks for, so the
kernels here add the relative jitter ours use (the meta-GP's on K_**, each module's own on its
K_kk, 10⁻⁶ of the mean diagonal by default) to K(X, X): one small addition per matrix, without
which their bound has no finite value at k-means inducing inputs and our bound's value is not
theirs.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
import types
from collections.abc import Iterator
from pathlib import Path

import torch


@contextlib.contextmanager
def torch_shims() -> Iterator[None]:
    """``torch.solve(B, A) = (A⁻¹B, None)`` and ``torch.cholesky = torch.linalg.cholesky``,
    float64 as the default dtype (their tensors are created with it), restored on exit."""
    saved = torch.solve, torch.cholesky, torch.get_default_dtype()
    torch.solve = lambda B, A: (torch.linalg.solve(A, B), None)
    torch.cholesky = lambda A, upper=False: torch.linalg.cholesky(A, upper=upper)
    torch.set_default_dtype(torch.float64)
    try:
        yield
    finally:
        torch.solve, torch.cholesky = saved[:2]
        torch.set_default_dtype(saved[2])


def load(checkout: Path) -> types.SimpleNamespace:
    """EnsembleGP, SVGP, RBF and Gaussian from a checkout of pmorenoz/RecyclableGP."""
    if not (checkout / "models" / "ensemblegp.py").exists():
        raise SystemExit(f"meta_gp: error: {checkout} is not a checkout of the authors' code "
                         "(no models/ensemblegp.py)")
    inference = types.ModuleType("GPy.inference.latent_function_inference")
    inference.LatentFunctionInference = object
    posterior = types.ModuleType("GPy.inference.latent_function_inference.posterior")
    posterior.Posterior = object
    for name, module in (("GPy", types.ModuleType("GPy")),
                         ("GPy.inference", types.ModuleType("GPy.inference")),
                         (inference.__name__, inference), (posterior.__name__, posterior)):
        sys.modules.setdefault(name, module)
    sys.path.insert(0, str(checkout))
    try:
        return types.SimpleNamespace(
            EnsembleGP=importlib.import_module("models.ensemblegp").EnsembleGP,
            SVGP=importlib.import_module("models.svgp").SVGP,
            RBF=importlib.import_module("kernels.rbf").RBF,
            Gaussian=importlib.import_module("likelihoods.gaussian").Gaussian)
    finally:
        sys.path.remove(str(checkout))


def _jittered(rbf: type, relative_jitter: float) -> type:
    """Their RBF with ``relative_jitter`` × mean diagonal added to K(X, X)."""

    class Jittered(rbf):
        def K(self, X, X2=None):
            K = super().K(X, X2)
            if X2 is None or X2 is X:
                K = K + relative_jitter * K.diagonal().mean() * torch.eye(K.shape[0])
            return K

    return Jittered


def ensemble_like(authors: types.SimpleNamespace, meta, stack) -> torch.nn.Module:
    """Their EnsembleGP over the stack's modules (model units, float64), started where ``meta``
    (an uncollapsed :class:`~pyrogp_models.models.meta.meta_gp.MetaGP` with the RBF kernel) is:
    the same Z_*, global hyperparameters and q(u_*) (unwhitened); Z_* learned as well, so one
    evaluation's gradient covers what ours does."""
    from pyrogp_models.gaussian import conditionals

    with torch_shims(), torch.no_grad():
        models = []
        for group in stack.groups:
            mean, chol, _, _ = group.first_latent()
            for k, name in enumerate(group.names):
                jitter = stack.modules[name].jitter
                kernel = _jittered(authors.RBF, jitter)(variance=1.0, length_scale=1.0)
                kernel.variance.copy_(group.kernel.variance[k, 0])
                kernel.length_scale.copy_(group.kernel.lengthscale[k, 0, :1])
                model = authors.SVGP(kernel, authors.Gaussian(), group.num_inducing)
                model.z = torch.nn.Parameter(group.inducing[k].clone(), requires_grad=False)
                model.q_m = torch.nn.Parameter(mean[k].unsqueeze(-1).clone())
                model.q_L = torch.nn.Parameter(chol[k].clone())
                models.append(model)
        kernel = _jittered(authors.RBF, meta.jitter)(variance=1.0, length_scale=1.0)
        kernel.variance.copy_(meta.kernel.variance.reshape(1))
        kernel.length_scale.copy_(meta.kernel.lengthscale.reshape(-1)[:1])
        ensemble = authors.EnsembleGP(kernel, authors.Gaussian(), models, meta.num_inducing)
        ensemble.z = torch.nn.Parameter(meta.inducing.detach().clone())
        q_mean, q_chol = conditionals.unwhiten(meta.prior_cholesky(), meta.q_mean, meta.q_sqrt)
        ensemble.q_m = torch.nn.Parameter(q_mean.unsqueeze(-1).clone())
        ensemble.q_L = torch.nn.Parameter(q_chol.clone())
    return ensemble


def evaluation(ensemble: torch.nn.Module):
    """One evaluation of their negative bound and its gradient (their ``forward`` + backward)."""
    def run() -> float:
        with torch_shims():
            ensemble.zero_grad(set_to_none=True)
            loss = ensemble()
            loss.backward()
        return float(loss.detach())
    return run
