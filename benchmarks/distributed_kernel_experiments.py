"""Experiments of the distributed-kernel sparse GP (Titsias, "Distributed kernel representations
for variational sparse Gaussian processes", talk slides): tables and PNG plots.

1. The slides' 1-D demo: n = 200, m = 15, inducing inputs before and after optimising the bound
   (Titsias 2009 with J = 1, and the distributed kernel with J = 3 × m = 5). The slides' data set is
   not named (probably Snelson's); a synthetic 200-point set of the same shape is used.
2. The slides' kernel split: SE (σ_f = ℓ = 1) on [−20, 20], cuts −10, −5, 0, 5, 10: the kernel
   matrix, the six local kernel matrices, one sample path of each local GP and their sum.
3. Long 1-D series at equal wall time: 10⁵ points of a chirp (detail growing along x) and the NASA
   sunspot series, J regions × m inducing inputs against one SVGP with M = J·m on its best recipe
   (the collapsed bound by L-BFGS; on the chirp also the minibatch SVGP with natural gradients),
   every model with the library's default training (``distributed_kernel.race``).
4. Boundary variance inflation of the mean-field q: predictive variance of mean-field
   and joint optima against the exact GP, and the mean-field gap as boundaries are added.

Writes ``distributed_kernel_experiments.md`` (+ ``.json``) and ``dk_*.png`` to ``--out``
(default ``benchmarks/results/``, with ``--quick`` ``benchmarks/results/quick/``). Run:
``python benchmarks/distributed_kernel_experiments.py``.
"""

from __future__ import annotations

import math
import sys
from dataclasses import replace
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import distributed_kernel as bench  # noqa: E402
from _common import (  # noqa: E402
    RESULTS_DIR,
    agg_pyplot,
    apply_threads,
    benchmark_parser,
    load_average,
    machine_info,
    markdown_table,
    write_json,
)
from pyrogp_models.inference.distributed_kernel_fit import train_distributed_kernel  # noqa: E402
from pyrogp_models.inference.train_config import (  # noqa: E402
    DISTRIBUTED_KERNEL_COLLAPSED_CONFIG as COLLAPSED_CONFIG,
)

from pyrogp_models.data import load_sunspots  # noqa: E402
from pyrogp_models.kernels import RBF, stationary_covariance  # noqa: E402
from pyrogp_models.likelihoods import make_likelihood  # noqa: E402
from pyrogp_models.models.distributed_kernel import collapsed  # noqa: E402
from pyrogp_models.models.distributed_kernel.backfitting import backfit  # noqa: E402
from pyrogp_models.models.distributed_kernel.halo import full_halo  # noqa: E402
from pyrogp_models.models.distributed_kernel.local_kernels import LocalKernels  # noqa: E402
from pyrogp_models.models.distributed_kernel.model import DistributedKernelGP  # noqa: E402
from pyrogp_models.models.distributed_kernel.regions import Regions  # noqa: E402

plt = agg_pyplot()


def se_kernel(X, Z, ell=1.0, sf2=1.0) -> torch.Tensor:
    """The SE kernel matrix k(X, Z) in functional form: a reference computation with no Pyro
    parameters (nothing enters Pyro's parameter store)."""
    return stationary_covariance("rbf", X, Z, torch.tensor([float(ell)]), torch.tensor(float(sf2)))


def exact_log_marginal(X, y, ell, sf2, noise) -> float:
    K = se_kernel(X, X, ell, sf2) + noise * torch.eye(len(y))
    return float(torch.distributions.MultivariateNormal(torch.zeros(len(y)), K).log_prob(y))


def exact_prediction(X, y, Xs, ell, sf2, noise):
    L = torch.linalg.cholesky(se_kernel(X, X, ell, sf2) + noise * torch.eye(len(y)))
    Ks = se_kernel(Xs, X, ell, sf2)
    mean = Ks @ torch.cholesky_solve(y.unsqueeze(-1), L).squeeze(-1)
    V = torch.linalg.solve_triangular(L, Ks.mT, upper=False)
    return mean, sf2 - V.square().sum(0)


# 1. the slides' 1-D demo --------------------------------------------------------------------------
def demo_data(n=200, seed=0):
    generator = torch.Generator().manual_seed(seed)
    x = (torch.rand(n, generator=generator) * 6).sort().values
    f = torch.sin(2.0 * x) + 0.4 * torch.sin(5.0 * x) * torch.exp(-0.3 * x) + 0.2 * x
    return x.unsqueeze(-1), f + 0.25 * torch.randn(n, generator=generator)


def demo_fit(X, y, cuts, m_per_region, steps: int | None):
    regions = Regions.from_cuts(cuts)
    bounds = [float(X.min())] + list(cuts) + [float(X.max())]
    # deliberately poor start: every region's Z bunched in the left quarter of the region
    Z = torch.stack([torch.linspace(lo, lo + 0.25 * (hi - lo), m_per_region)
                     for lo, hi in zip(bounds[:-1], bounds[1:], strict=True)]).unsqueeze(-1)
    model = DistributedKernelGP(regions, Z, RBF(1, lengthscale=0.7, variance=1.0),
                                make_likelihood("gaussian", variance=0.1), X, y)
    before_Z = model.inducing.detach().clone()
    config = COLLAPSED_CONFIG if steps is None else replace(COLLAPSED_CONFIG, steps=steps)
    Xs = torch.linspace(-0.5, 6.5, 400).unsqueeze(-1)
    # stage 1: hyperparameters with Z frozen (the "before" picture), stage 2: Z as well
    bounds, predictions = [], []
    for learn_inducing in (False, True):
        model.layer.inducing_unit_unconstrained.requires_grad_(learn_inducing)
        train_distributed_kernel(model, "solve", config)
        with torch.no_grad():
            bounds.append(float(collapsed.meanfield_collapsed_bound(model, X, y)))
            predictions.append(model.likelihood.predictive_moments(*model.predict_latent(Xs)))
    before, after = bounds
    ell, sf2 = float(model.kernel.lengthscale.detach()), float(model.kernel.variance.detach())
    noise = float(model.likelihood.variance.detach())
    return {"J": len(cuts) + 1, "m": m_per_region, "bound_before": before, "bound_after": after,
            "exact_log_marginal": exact_log_marginal(X, y, ell, sf2, noise),
            "lengthscale": ell, "noise": noise, "Z_before": before_Z.flatten().tolist(),
            "Z_after": model.inducing.detach().flatten().tolist(),
            "plot": (Xs, *predictions)}


def experiment_demo(out: Path, steps: int | None):
    X, y = demo_data()
    runs = [demo_fit(X, y, [], 15, steps), demo_fit(X, y, [2.0, 4.0], 5, steps)]
    fig, axes = plt.subplots(2, 2, figsize=(12, 7), sharex=True, sharey=True)
    for row, run in zip(axes, runs, strict=True):
        Xs, before, after = run.pop("plot")
        for ax, (mean, var), Z, title in ((row[0], before, run["Z_before"], "before"),
                                          (row[1], after, run["Z_after"], "after")):
            sd = var.sqrt()
            ax.plot(X[:, 0], y, ".", ms=3, color="0.5")
            ax.plot(Xs[:, 0], mean, "b")
            ax.fill_between(Xs[:, 0], mean - 2 * sd, mean + 2 * sd, color="b", alpha=0.15)
            ax.plot(Z, [float(y.min()) - 0.5] * len(Z), "kx")
            ax.set_title(f"J={run['J']}, m={run['m']}: Z {title} optimising the bound")
    fig.tight_layout()
    fig.savefig(out / "dk_demo_1d.png", dpi=110)
    plt.close(fig)
    return runs


# 2. the slides' kernel split ----------------------------------------------------------------------
def experiment_kernel_split(out: Path):
    regions = Regions.from_cuts([-10.0, -5.0, 0.0, 5.0, 10.0])
    kernel = RBF(1, lengthscale=1.0, variance=1.0)
    x = torch.linspace(-20, 20, 401).unsqueeze(-1)
    with torch.no_grad():
        local = LocalKernels(kernel, regions)(x)
        full = kernel(x)
    generator = torch.Generator().manual_seed(3)
    samples = torch.stack([
        torch.linalg.cholesky(K + 1e-9 * torch.eye(len(x))) @ torch.randn(len(x),
                                                                           generator=generator)
        for K in local])
    fig = plt.figure(figsize=(14, 7))
    ax = fig.add_subplot(2, 7, 1)
    ax.imshow(full, cmap="viridis")
    ax.set_title("k")
    ax.axis("off")
    for j in range(6):
        ax = fig.add_subplot(2, 7, j + 2)
        ax.imshow(local[j], cmap="viridis", vmin=0, vmax=1)
        ax.set_title(f"k_{j + 1}")
        ax.axis("off")
    ax = fig.add_subplot(2, 1, 2)
    for j in range(6):
        ax.plot(x[:, 0], samples[j], lw=1, label=f"f_{j + 1}")
    ax.plot(x[:, 0], samples.sum(0), "k", lw=2, label="Σ f_j ~ GP(0, k)")
    for cut in (-10, -5, 0, 5, 10):
        ax.axvline(cut, color="0.7", ls=":")
    ax.legend(ncol=7, fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "dk_kernel_split.png", dpi=110)
    plt.close(fig)
    eig = torch.linalg.eigvalsh(local)
    return {"max_abs_sum_error": float((local.sum(0) - full).abs().max()),
            "min_relative_eigenvalue": float((eig.min(-1).values / eig.max(-1).values).min())}


# 3. long series at equal time ---------------------------------------------------------------------
def sunspot_data():
    table = load_sunspots()
    t = torch.tensor(table.column("year") + (table.column("month") - 0.5) / 12.0).unsqueeze(-1)
    s = torch.tensor(table.column("sunspots"))
    s = (s - s.mean()) / s.std()
    test = torch.arange(len(s)) % 5 == 4
    return t[~test], s[~test], t[test], s[test]


def plot_predictions(ax, Xs, ys, runs, window, truth=None):
    ax.plot(Xs[window, 0], ys[window], ".", ms=2, color="0.6", label="test data")
    if truth is not None:
        ax.plot(Xs[window, 0], truth[window], "k", lw=1, label="f")
    for run, colour in zip(runs, ("b", "r", "g"), strict=False):
        mean, var_y = run.pop("prediction")
        sd = var_y.sqrt()
        x = Xs[window, 0]
        ax.plot(x, mean[window], colour, lw=1, label=f"{run['model']} (NLPD {run['nlpd']:.2f})")
        ax.fill_between(x, (mean - 2 * sd)[window], (mean + 2 * sd)[window], color=colour,
                        alpha=0.12)
    ax.legend(fontsize=7, loc="upper left")


def experiment_long_series(out: Path, budget_chirp, budget_sunspots, n_chirp):
    X, y, Xs, ys = bench.chirp_data(n_chirp, 10000, noise=0.01)
    chirp_runs = bench.race(X, y, Xs, ys, 32, 16, budget_chirp, batch_size=1000,
                            keep_prediction=True)
    X2, y2, Xs2, ys2 = sunspot_data()
    sun_runs = bench.race(X2, y2, Xs2, ys2, 16, 16, budget_sunspots, keep_prediction=True)
    fig, axes = plt.subplots(2, 1, figsize=(12, 7))
    plot_predictions(axes[0], Xs, ys, chirp_runs, (Xs[:, 0] > 80) & (Xs[:, 0] < 90),
                     bench.chirp(Xs[:, 0]))
    axes[0].set_title(f"chirp (n = {n_chirp}), x ∈ [80, 90]: the finest detail, "
                      f"at most {budget_chirp:.0f} s of training each")
    plot_predictions(axes[1], Xs2, ys2, sun_runs, (Xs2[:, 0] > 1950) & (Xs2[:, 0] < 2015))
    axes[1].set_title(f"sunspots (standardised), 1950–2015, at most {budget_sunspots:.0f} s of "
                      "training each")
    fig.tight_layout()
    fig.savefig(out / "dk_long_series.png", dpi=110)
    plt.close(fig)
    return ([{"data": f"chirp, n={n_chirp}"} | r for r in chirp_runs]
            + [{"data": f"sunspots, n={len(y2)}"} | r for r in sun_runs])


# 4. boundary variance inflation -------------------------------------------------------------------
def gp_draw(n=300, seed=0, noise=0.05):
    generator = torch.Generator().manual_seed(seed)
    x = (torch.rand(n, generator=generator) * 20 - 10).sort().values.unsqueeze(-1)
    K = se_kernel(x, x) + 1e-9 * torch.eye(n)
    f = torch.linalg.cholesky(K) @ torch.randn(n, generator=generator)
    return x, f + math.sqrt(noise) * torch.randn(n, generator=generator)


def experiment_boundary_variance(out: Path, m=12):
    X, y = gp_draw()
    noise = 0.05
    cuts = [-5.0, 0.0, 5.0]
    edges = [-10.0, -5.0, 0.0, 5.0, 10.0]
    Z = torch.stack([torch.linspace(edges[j], edges[j + 1], m) for j in range(4)]).unsqueeze(-1)
    models = {}
    for variational in ("meanfield", "joint"):
        model = DistributedKernelGP(Regions.from_cuts(cuts), Z, RBF(1),
                                    make_likelihood("gaussian", variance=noise),
                                    variational=variational)
        if variational == "meanfield":      # coordinate ascent on the mean-field ELBO itself
            sweeps = backfit(model, X, y, max_sweeps=5000, tol=1e-11,
                             halo=full_halo(len(y), 4)).sweeps
        else:
            model.set_whitened_posterior(*collapsed.optimal_joint_posterior(model, X, y))
        models[variational] = model
    Xs = torch.linspace(-9.5, 9.5, 381).unsqueeze(-1)
    exact_mean, exact_var = exact_prediction(X, y, Xs, 1.0, 1.0, noise)
    mf_mean, mf_var = models["meanfield"].predict_latent(Xs)
    joint_mean, joint_var = models["joint"].predict_latent(Xs)
    ratio_mf, ratio_joint = mf_var / exact_var, joint_var / exact_var
    near = torch.zeros(len(Xs), dtype=torch.bool)
    for cut in cuts:
        near |= (Xs[:, 0] - cut).abs() <= 1.0
    summary = {
        "exact_log_marginal": exact_log_marginal(X, y, 1.0, 1.0, noise),
        "bound_joint": float(collapsed.joint_collapsed_bound(models["joint"], X, y)),
        "bound_meanfield": float(collapsed.meanfield_collapsed_bound(models["meanfield"], X, y)),
        "max_variance_ratio_meanfield": float(ratio_mf.max()),
        "max_variance_ratio_joint": float(ratio_joint.max()),
        "median_ratio_meanfield_inside": float(ratio_mf[~near].median()),
        "max_abs_mean_difference_mf_joint": float((mf_mean - joint_mean).abs().max()),
        "backfitting_sweeps": sweeps,
        "max_abs_mean_error_joint": float((joint_mean - exact_mean).abs().max()),
        "at_cut_0": {"exact": float(exact_var[190]), "meanfield": float(mf_var[190]),
                     "joint": float(joint_var[190])},
    }
    gaps = []
    X4, y4 = gp_draw(400, seed=1)
    for J in (1, 2, 4, 8):
        cuts_J = [-10.0 + 20.0 * k / J for k in range(1, J)]
        edges_J = [-10.0] + cuts_J + [10.0]
        ZJ = torch.stack([torch.linspace(edges_J[j], edges_J[j + 1], max(4, 48 // J))
                          for j in range(J)]).unsqueeze(-1)
        model = DistributedKernelGP(Regions.from_cuts(cuts_J), ZJ, RBF(1),
                                    make_likelihood("gaussian", variance=noise))
        gaps.append({"J": J, "m": ZJ.shape[1],
                     "gap_nats": float(collapsed.meanfield_gap(model, X4, y4))})
    summary["meanfield_gap_by_J"] = gaps
    fig, axes = plt.subplots(2, 1, figsize=(11, 6), sharex=True)
    axes[0].plot(Xs[:, 0], exact_var, "k", label="exact GP")
    axes[0].plot(Xs[:, 0], joint_var, "g--", label="joint q")
    axes[0].plot(Xs[:, 0], mf_var, "r", label="mean-field q")
    axes[0].set_ylabel("var f(x*)")
    axes[0].legend()
    axes[1].plot(Xs[:, 0], ratio_mf, "r", label="mean-field / exact")
    axes[1].plot(Xs[:, 0], ratio_joint, "g--", label="joint / exact")
    axes[1].set_ylabel("variance ratio")
    axes[1].legend()
    for ax in axes:
        for cut in cuts:
            ax.axvline(cut, color="0.7", ls=":")
    fig.tight_layout()
    fig.savefig(out / "dk_boundary_variance.png", dpi=110)
    plt.close(fig)
    return summary


def markdown(report) -> str:
    machine = report["machine"]
    lines = ["# Distributed-kernel sparse GP: experiments", "",
             f"Commit {machine['commit']} (uncommitted changes: {machine['dirty']}; "
             f"pyrogp_models {machine['pyrogp_models']}); torch {machine['torch']}, "
             f"{machine['torch_threads']} thread(s), float64; load average "
             f"{machine['load_average']} at the start, {machine['load_average_end']} at the end "
             "(a shared 2-core machine: the seconds in section 3 are one fit each, with the CPU "
             "seconds the fit got). Every fit uses the library's default training"
             + ("" if report["steps"] is None else f", capped at {report['steps']} steps")
             + ".", ""]
    lines += ["## 1. 1-D demo (n = 200, 15 inducing inputs in all)", ""]
    lines += markdown_table(
        ["J × m", "bound, Z fixed", "bound, Z optimised", "exact log p(y)", "ℓ", "σ²"],
        [[f"{r['J']} × {r['m']}", f"{r['bound_before']:.2f}", f"{r['bound_after']:.2f}",
          f"{r['exact_log_marginal']:.2f}", f"{r['lengthscale']:.3f}", f"{r['noise']:.4f}"]
         for r in report["demo"]])
    split = report["kernel_split"]
    lines += ["", "![demo](dk_demo_1d.png)", "", "## 2. Kernel split of the slides", "",
              f"max |Σ_j K_j − K| = {split['max_abs_sum_error']:.1e}; smallest "
              f"λ_min/λ_max over the K_j = {split['min_relative_eigenvalue']:.1e}.", "",
              "![split](dk_kernel_split.png)", "",
              "## 3. Long series at equal wall time", ""]
    series = report["long_series"]
    lines += bench.race_table(series)
    lines += ["", "Each model trains with the library's defaults from its own default "
              "initialisation and stops at its convergence test or at the budget; the SVGP on "
              "its best recipe (the collapsed bound by L-BFGS) and, on the chirp, also with "
              "minibatches and natural gradients."]
    for data in dict.fromkeys(r["data"] for r in series):
        lines += ["", f"{data}: " + bench.race_summary([r for r in series if r["data"] == data])]
    b = report["boundary_variance"]
    lines += ["", "![long series](dk_long_series.png)", "",
              "## 4. Boundary variance inflation of mean-field (n = 300 GP draw, J = 4, m = 12)",
              ""]
    lines += markdown_table(["quantity", "value"], [
        ["exact log p(y)", f"{b['exact_log_marginal']:.3f}"],
        ["joint collapsed bound", f"{b['bound_joint']:.3f}"],
        ["mean-field collapsed bound", f"{b['bound_meanfield']:.3f}"],
        ["max var ratio mean-field / exact", f"{b['max_variance_ratio_meanfield']:.3f}"],
        ["max var ratio joint / exact", f"{b['max_variance_ratio_joint']:.4f}"],
        ["median ratio mean-field / exact, > 1ℓ from cuts",
         f"{b['median_ratio_meanfield_inside']:.4f}"],
        ["var at x = 0: exact / MF / joint", f"{b['at_cut_0']['exact']:.5f} / "
         f"{b['at_cut_0']['meanfield']:.5f} / {b['at_cut_0']['joint']:.5f}"],
        [f"max |mean MF (backfitting, {b['backfitting_sweeps']} sweeps) − mean joint|",
         f"{b['max_abs_mean_difference_mf_joint']:.1e}"]])
    lines += [""]
    lines += markdown_table(["J (n = 400, 48 inducing in all)", "mean-field gap (nats)"],
                            [[f"{g['J']} × {g['m']}", f"{g['gap_nats']:.3f}"]
                             for g in b["meanfield_gap_by_J"]])
    lines += ["", "![variance](dk_boundary_variance.png)", ""]
    return "\n".join(lines)


def main(argv=None):
    parser = benchmark_parser(__doc__.splitlines()[0], "distributed_kernel_experiments",
                              out_help="folder of the report, its JSON and the plots")
    args = parser.parse_args(argv)
    out = args.out or (RESULTS_DIR / "quick" if args.quick else RESULTS_DIR)
    apply_threads(args)
    torch.set_default_dtype(torch.float64)
    out.mkdir(parents=True, exist_ok=True)
    steps = 60 if args.quick else None
    report = {"machine": machine_info(), "steps": steps}
    print("1. demo", flush=True)
    report["demo"] = experiment_demo(out, steps)
    print("2. kernel split", flush=True)
    report["kernel_split"] = experiment_kernel_split(out)
    print("3. long series", flush=True)
    report["long_series"] = experiment_long_series(
        out, 10.0 if args.quick else 30.0, 5.0 if args.quick else 20.0,
        20000 if args.quick else 100000)
    print("4. boundary variance", flush=True)
    report["boundary_variance"] = experiment_boundary_variance(out)
    report["machine"]["load_average_end"] = load_average()
    text = markdown(report)
    (out / "distributed_kernel_experiments.md").write_text(text, encoding="utf-8")
    write_json(out / "distributed_kernel_experiments.json", report)
    print(text)


if __name__ == "__main__":
    main()
