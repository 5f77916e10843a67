"""Benchmark: a multitask classifier with the library's defaults — time, steps and held-out scores.

A Bernoulli likelihood has no collapsed bound: L-BFGS fits q(u) of every inducing value with the
hyperparameters, so its stopping rule sets the cost. The default stops at 10⁻⁵ (relative) over
two steps (``MULTITASK_UNCOLLAPSED_CONFIG``); a collapsed bound stops at 10⁻⁷. This script fits
both rules side by side, one after the other for each model, and scores what they predict.

Data: scikit-learn's breast cancer set (569 rows, bundled with the package), the first five
features, malignant (1) or benign (0), as three tasks: every row given a task at random and 70 %
of the rows (399) drawn for training, the rest (170) held out. Models: the default (cGP, the
rank compared by the ELBO, M = every row of the largest task) and ``--model igp``. Baselines: a
pooled logistic regression on the standardised features (the task ignored), scikit-learn's
defaults, and scikit-learn's exact GP classifier on the same pooled features (Laplace, a
lengthscale per feature, two restarts). Scores: held-out log loss (mean negative log probability
of the label) and accuracy.

Usage::

    python benchmarks/multitask_classifier.py          # → results/multitask_classifier.json
    python benchmarks/multitask_classifier.py --quick  # smoke run (60 training rows)
"""

from __future__ import annotations

import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from _common import (  # noqa: E402
    apply_threads,
    benchmark_parser,
    load_average,
    machine_info,
    output_path,
    print_table,
    write_json,
)
from pyrogp_models.inference import metrics  # noqa: E402
from pyrogp_models.inference.multitask_fit import (  # noqa: E402
    MultitaskSpec,
    default_config,
    fit_multitask_dgp,
)

#: The stopping rule of a collapsed bound, which an uncollapsed fit used before.
COLLAPSED_TOL = 1e-7


@dataclass(frozen=True)
class Settings:
    train_rows: int = 399
    test_rows: int = 170
    features: int = 5
    tasks: int = 3
    models: tuple[str, ...] = ("cgp", "igp")
    gpc_restarts: int = 2
    seed: int = 0


FULL = Settings()
QUICK = Settings(train_rows=60, test_rows=40, features=2, tasks=2, gpc_restarts=0)


def breast_cancer_tasks(s: Settings):
    """(training pairs per task [(X^t, y^t)], test inputs [N*, D], test tasks [N*], test labels
    [N*]): rows drawn at random (``s.seed``), each given one of ``s.tasks`` tasks at random;
    the label is 1 for malignant."""
    from sklearn.datasets import load_breast_cancer

    data = load_breast_cancer()
    X = data.data[:, :s.features].astype(float)
    y = (data.target == 0).astype(float)  # scikit-learn codes malignant as 0
    rng = np.random.default_rng(s.seed)
    order = rng.permutation(len(y))[:s.train_rows + s.test_rows]
    task = rng.integers(0, s.tasks, len(y))
    train, test = order[:s.train_rows], order[s.train_rows:]
    pairs = [(X[train][task[train] == t], y[train][task[train] == t]) for t in range(s.tasks)]
    return pairs, X[test], task[test], y[test]


def scores(probability: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    """Held-out log loss (:func:`~pyrogp_models.inference.metrics.nlpd` of the labels,
    probabilities clipped to [10⁻¹², 1 − 10⁻¹²]) and accuracy."""
    p = np.clip(probability, 1e-12, 1 - 1e-12)
    return {"log_loss": metrics.nlpd(np.where(labels == 1, np.log(p), np.log1p(-p))),
            "accuracy": metrics.accuracy(labels, probability)}


def pooled(pairs) -> tuple[np.ndarray, np.ndarray]:
    """Every task's rows in one table (X [N, D], y [N]): the task ignored."""
    return (np.concatenate([X_t for X_t, _ in pairs]),
            np.concatenate([y_t for _, y_t in pairs]))


def logistic_baseline(pairs, X_test: np.ndarray, y_test: np.ndarray) -> dict[str, float]:
    """A pooled logistic regression on standardised features (scikit-learn's defaults)."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    model = make_pipeline(StandardScaler(), LogisticRegression()).fit(*pooled(pairs))
    return scores(model.predict_proba(X_test)[:, 1], y_test)


def scikit_learn_gp_classifier(pairs, X_test: np.ndarray, y_test: np.ndarray,
                               restarts: int) -> dict[str, float]:
    """scikit-learn's GaussianProcessClassifier (Laplace approximation, exact: every row) on the
    pooled standardised features, a constant × RBF kernel with a lengthscale per feature,
    ``restarts`` restarts of its optimiser; timed."""
    from sklearn.gaussian_process import GaussianProcessClassifier
    from sklearn.gaussian_process.kernels import RBF, ConstantKernel
    from sklearn.preprocessing import StandardScaler

    X, y = pooled(pairs)
    scaler = StandardScaler().fit(X)
    kernel = ConstantKernel() * RBF(np.ones(X.shape[1]))
    started = time.perf_counter()
    model = GaussianProcessClassifier(kernel, n_restarts_optimizer=restarts, random_state=0)
    model.fit(scaler.transform(X), y)
    seconds = time.perf_counter() - started
    return {"seconds": seconds, "restarts": restarts,
            **scores(model.predict_proba(scaler.transform(X_test))[:, 1], y_test)}


def fit_and_score(kind: str, rule: str, pairs, X_test, task_test, y_test) -> dict:
    """One fit of ``kind`` under the default rule or the collapsed bound's, timed and scored."""
    spec = MultitaskSpec(model=kind, likelihood="bernoulli")
    config = default_config(spec)
    if rule == "collapsed tol":
        config = replace(config, tol=COLLAPSED_TOL)
    fit = fit_multitask_dgp(pairs, spec, config)
    with torch.no_grad():
        probability = fit.predictor.predict_y(torch.as_tensor(X_test),
                                              torch.as_tensor(task_test))[0]
    row = {"model": kind, "rule": rule, "tol": config.tol,
           "num_inducing": fit.model.top.layer.num_inducing, **fit.summary(),
           **scores(probability.numpy(), y_test)}
    print(f"  {kind} ({rule}): {fit.seconds:.1f} s, {fit.steps} steps, ELBO {fit.elbo:.4f}, "
          f"log loss {row['log_loss']:.4f}, accuracy {row['accuracy']:.3f}", flush=True)
    return row


def main(argv=None) -> dict:
    args = benchmark_parser(__doc__.split("\n\n")[0], "multitask_classifier").parse_args(argv)
    settings = QUICK if args.quick else FULL
    apply_threads(args)
    mode = "quick" if args.quick else "full"
    out = output_path(args, "multitask_classifier")
    started = time.perf_counter()
    pairs, X_test, task_test, y_test = breast_cancer_tasks(settings)
    payload: dict = {"benchmark": "multitask_classifier", "mode": mode,
                     "machine": machine_info(), "settings": asdict(settings),
                     "baseline": logistic_baseline(pairs, X_test, y_test),
                     "scikit_learn_gpc": scikit_learn_gp_classifier(pairs, X_test, y_test,
                                                                    settings.gpc_restarts),
                     "fits": []}
    print(f"multitask_classifier benchmark ({mode}): {settings.train_rows} training rows in "
          f"{settings.tasks} tasks, {torch.get_num_threads()} thread(s)", flush=True)
    for kind in settings.models:
        for rule in ("default", "collapsed tol"):
            payload["fits"].append(fit_and_score(kind, rule, pairs, X_test, task_test, y_test))
    baseline = payload["baseline"]
    rows = [[row["model"], row["rule"], f"{row['seconds']:.1f}", row["steps"],
             f"{row['elbo']:.4f}", row["kept"], f"{row['log_loss']:.4f}",
             f"{row['accuracy']:.3f}"] for row in payload["fits"]]
    gpc = payload["scikit_learn_gpc"]
    rows.append(["scikit-learn GPC", "Laplace", f"{gpc['seconds']:.1f}", "", "", "",
                 f"{gpc['log_loss']:.4f}", f"{gpc['accuracy']:.3f}"])
    rows.append(["logistic regression", "—", "", "", "", "", f"{baseline['log_loss']:.4f}",
                 f"{baseline['accuracy']:.3f}"])
    print_table(rows, ["model", "rule", "seconds", "steps", "ELBO", "kept", "log loss",
                       "accuracy"], "Bernoulli multitask fits with the defaults (held out)")
    payload["total_seconds"] = time.perf_counter() - started
    payload["machine"]["load_average_end"] = load_average()
    path = write_json(out, payload)
    print(f"\nJSON written to {path}", flush=True)
    return payload


if __name__ == "__main__":
    main()
