"""Plain helpers shared by several test modules: CSV data files, in-process ``pyrogp`` runs,
quick benchmark runs and matrices with a chosen smallest eigenvalue. Import them as
``from helpers import ...`` (``tests`` is on the path)."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch
from pyrogp_models.inference.cli import main
from safetensors.torch import load as load_safetensors

from pyrogp_models.modules.signed import signed_bytes

ROOT = Path(__file__).resolve().parents[1]


def write_csv(path, columns: dict[str, np.ndarray]):
    """Write equal-length columns to ``path`` as CSV with a header row; returns ``path``."""
    np.savetxt(path, np.column_stack(list(columns.values())), delimiter=",",
               header=",".join(columns), comments="")
    return path


def run_ok(capsys, *argv) -> str:
    """Run a ``pyrogp`` command that must succeed; returns what it printed to stdout."""
    capsys.readouterr()
    assert main([str(arg) for arg in argv]) == 0
    return capsys.readouterr().out


def run_failing(capsys, *argv) -> str:
    """Run a ``pyrogp`` command that must fail; returns its one-line error message."""
    capsys.readouterr()
    code = main([str(arg) for arg in argv])
    captured = capsys.readouterr()
    assert code == 2
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("pyrogp: error: "), captured.err
    return lines[0]


def run_quick_benchmark(script: str, out: Path, hang_seconds: float = 900.0) -> str:
    """Run ``benchmarks/<script> --quick --out <out>`` from the repository root; asserts it
    succeeds and returns its stdout. No wall-clock assert (a busy CI machine makes them flaky):
    ``hang_seconds`` only stops a run that hangs."""
    completed = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), "--quick", "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=hang_seconds)
    assert completed.returncode == 0, completed.stderr[-3000:]
    return completed.stdout


def quick_benchmark_payload(script: str, tmp_path: Path, hang_seconds: float = 900.0) -> dict:
    """:func:`run_quick_benchmark` into ``tmp_path/<name>_quick.json``: asserts the script says
    where it wrote its JSON and that the JSON names the benchmark and the quick mode; the JSON."""
    name = Path(script).stem
    out = tmp_path / f"{name}_quick.json"
    assert f"JSON written to {out}" in run_quick_benchmark(script, out, hang_seconds)
    payload = json.loads(out.read_text())
    assert (payload["benchmark"], payload["mode"]) == (name, "quick")
    return payload


# Baselines computed in the tests: a fitted model must beat them by a margin -------------------
def gaussian_scores(y, mean, var) -> dict[str, float]:
    """RMSE and NLPD (mean negative log density of y under N(mean, var)) of a Gaussian
    predictive."""
    y, mean, var = (np.asarray(a, dtype=float) for a in (y, mean, var))
    var = np.broadcast_to(var, y.shape)
    nlpd = np.mean(0.5 * np.log(2 * np.pi * var) + 0.5 * (y - mean) ** 2 / var)
    return {"rmse": float(np.sqrt(np.mean((y - mean) ** 2))), "nlpd": float(nlpd)}


def constant_scores(y_train, y_test) -> dict[str, float]:
    """The constant predictor N(mean y_train, var y_train) scored on y_test."""
    y_train = np.asarray(y_train, dtype=float)
    return gaussian_scores(y_test, y_train.mean(), y_train.var())


def interpolation_rmse(x_train, y_train, x_test, y_test) -> float:
    """RMSE on the test points of the piecewise-linear interpolation of the training points
    (one input)."""
    x_train, y_train = np.asarray(x_train, dtype=float).ravel(), np.asarray(y_train, dtype=float)
    order = np.argsort(x_train)
    predicted = np.interp(np.asarray(x_test, dtype=float).ravel(), x_train[order],
                          y_train[order])
    return float(np.sqrt(np.mean((np.asarray(y_test) - predicted) ** 2)))


def exact_gp_scores(X_train, y_train, X_test, y_test, ard: bool = True) -> dict[str, float]:
    """An exact GP fitted by scikit-learn (RBF kernel, learned noise, maximum marginal
    likelihood) scored on the test points: the reference a sparse or recycled GP approaches."""
    from sklearn.gaussian_process import GaussianProcessRegressor
    from sklearn.gaussian_process.kernels import RBF, ConstantKernel, WhiteKernel
    from threadpoolctl import threadpool_limits

    X_train = np.asarray(X_train, dtype=float).reshape(len(y_train), -1)
    X_test = np.asarray(X_test, dtype=float).reshape(len(y_test), -1)
    lengthscale = np.ones(X_train.shape[1]) if ard else 1.0
    kernel = (ConstantKernel(1.0, (1e-3, 1e3)) * RBF(lengthscale, (1e-2, 1e3))
              + WhiteKernel(0.1, (1e-6, 1e1)))
    with threadpool_limits(1):  # tiny matrices: BLAS threads only contend on a busy machine
        gp = GaussianProcessRegressor(kernel, normalize_y=True, random_state=0)
        mean, sd = gp.fit(X_train, y_train).predict(X_test, return_std=True)
    # sd includes the fitted white noise: a predictive of y
    return gaussian_scores(y_test, mean, sd ** 2)


def resigned(source: Path, target: Path, edit) -> Path:
    """Copy a pyrogp file after ``edit(record, tensors)``, signed again so that its checksum is
    valid for the new content (a careful forger); returns ``target``."""
    data = source.read_bytes()
    header = json.loads(data[8:8 + int.from_bytes(data[:8], "little")])
    record = json.loads(header["__metadata__"]["pyrogp"])
    tensors = load_safetensors(data)
    edit(record, tensors)
    target.write_bytes(signed_bytes(record, tensors))
    return target


def with_smallest_eigenvalue(relative: float, size: int = 5, scale: float = 1.0, seed: int = 0
                             ) -> torch.Tensor:
    """A symmetric float64 matrix whose smallest eigenvalue is ``relative`` × its mean diagonal
    (a negative ``relative`` needs that much relative jitter to factorise)."""
    rng = np.random.default_rng(seed)
    basis, _ = np.linalg.qr(rng.normal(size=(size, size)))
    eigenvalues = np.concatenate([[0.0], rng.uniform(0.5, 2.0, size - 1)])
    # the mean diagonal is the mean eigenvalue: λ₀ = r (λ₀ + Σ others) / n
    eigenvalues[0] = relative * eigenvalues[1:].sum() / (size - relative)
    matrix = scale * (basis * eigenvalues) @ basis.T
    return torch.as_tensor((matrix + matrix.T) / 2)
