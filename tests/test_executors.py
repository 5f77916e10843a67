"""Local fits on a real Dask cluster (two single-threaded worker processes) against the
in-process batched fit."""

from dataclasses import replace

import numpy as np
import pytest
import torch
from pyrogp_models.inference import executors
from pyrogp_models.inference.cli import main
from pyrogp_models.inference.executors import (
    chunk_tasks,
    dask_client,
    fit_local_distributed,
    fit_local_on,
    split_partitions,
)
from pyrogp_models.inference.local_fit import LocalFitSpec, fit_local
from pyrogp_models.inference.trainer import TrainConfig

from pyrogp_models.data.partitioners import Partition, partition_contiguous
from pyrogp_models.errors import DataError, PyrogpError
from pyrogp_models.modules.files import load_modules

TENSORS = ("inducing", "q_mean", "q_chol")
# Adam, full batch and no convergence test: every partition follows its own path.
CONFIG = TrainConfig(steps=25, tol=None, seed=3)


@pytest.fixture(scope="module")
def client():
    with dask_client(workers=2) as client:
        yield client


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(1)
    X = rng.uniform(0.0, 10.0, (230, 2))
    y = np.sin(X[:, 0]) + 0.3 * X[:, 1] + 0.1 * rng.normal(size=230)
    return X, y


@pytest.fixture(scope="module")
def uneven_partition(data):
    """Five partitions of unequal sizes along x0."""
    X, _ = data
    assignments = np.searchsorted([1.0, 4.0, 5.5, 8.0], X[:, 0])
    return Partition(assignments, {"kind": "contiguous", "num_partitions": 5, "dim": 0,
                                   "boundaries": [1.0, 4.0, 5.5, 8.0]})


def assert_same_modules(expected, actual):
    """Equal up to floating-point rounding: a worker batches fewer partitions together, so the
    batched products round differently (~1e-16 after one step), and Adam amplifies rounding in
    near-zero gradients (its step is g/√v) to ~1e-6 after 25 steps. A mix-up of partitions,
    data or initial values would differ at O(1)."""
    assert list(actual) == list(expected)
    for name, module in expected.items():
        other = actual[name]
        for field in TENSORS:
            torch.testing.assert_close(getattr(other, field), getattr(module, field),
                                       rtol=1e-5, atol=1e-5)
        for key, value in {**module.likelihood_params, **module.kernel.named_values()}.items():
            theirs = {**other.likelihood_params, **other.kernel.named_values()}[key]
            torch.testing.assert_close(theirs, value, rtol=1e-5, atol=1e-5)
        assert other.elbo == pytest.approx(module.elbo, rel=1e-6)
        assert other.num_data == module.num_data
        assert other.info == module.info
        np.testing.assert_array_equal(other.standardisation.x_mean,
                                      module.standardisation.x_mean)
        assert other.standardisation.y_scale == module.standardisation.y_scale


def assert_same_optimum(expected, actual, X, rel: float = 1e-9, atol: float = 1e-6):
    """The default fit (collapsed bound, batched L-BFGS) pins every partition at its optimum to
    rounding, whichever partitions share its batch: the same ELBO and predictions to 1e-6
    (rounding that differs between batch sizes changes the path, not the end point)."""
    assert list(actual) == list(expected)
    for name, module in expected.items():
        other = actual[name]
        assert module.info["converged"] and other.info["converged"]
        assert other.elbo == pytest.approx(module.elbo, rel=rel)
        for ours, theirs in zip(other.predict_y(X), module.predict_y(X), strict=True):
            np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=0, atol=atol)


def test_split_partitions_balances_points_in_contiguous_non_empty_runs():
    chunks = split_partitions(np.array([100, 1, 1, 1, 100]), 2)
    assert [c.tolist() for c in chunks] == [[0, 1, 2], [3, 4]]
    chunks = split_partitions(np.array([10, 10, 10, 10, 10, 10]), 3)
    assert [c.tolist() for c in chunks] == [[0, 1], [2, 3], [4, 5]]
    chunks = split_partitions(np.array([1, 1, 1, 1000]), 4)
    assert [c.tolist() for c in chunks] == [[0], [1], [2], [3]]
    assert len(split_partitions(np.array([5, 5]), 8)) == 2


def test_each_task_holds_only_its_chunk(data, uneven_partition):
    X, y = data
    spec = LocalFitSpec(num_inducing=[4, 5, 4, 5, 4])
    chunks, tasks, standardisation = chunk_tasks((X, y, uneven_partition), 2, spec, CONFIG)
    assert np.concatenate(chunks).tolist() == list(range(5))
    for chunk, task in zip(chunks, tasks, strict=True):
        rows = np.isin(uneven_partition.assignments, chunk)
        np.testing.assert_array_equal(task.X, X[rows])
        np.testing.assert_array_equal(task.y, y[rows])
        assert task.spec.num_inducing == [[4, 5, 4, 5, 4][k] for k in chunk]
        assert task.spec.names == [f"part{k:03d}" for k in chunk]
        assert task.spec.standardisation is standardisation
    np.testing.assert_allclose(standardisation.x_mean, X.mean(0))


def test_two_workers_reproduce_the_in_process_fit(client, data, uneven_partition):
    X, y = data
    spec = LocalFitSpec(num_inducing=[4, 5, 4, 5, 4], names=["a", "b", "c", "d", "e"])
    expected = fit_local((X, y, uneven_partition), spec, CONFIG)
    fit = fit_local_distributed(client, (X, y, uneven_partition), spec, CONFIG)
    assert len(fit.chunks) == 2
    assert_same_modules(expected.modules, fit.modules)
    assert [m.info["partition"] for m in fit.modules.values()] == [0, 1, 2, 3, 4]
    assert fit.result.steps == CONFIG.steps
    assert fit.result.final_loss == pytest.approx(expected.result.final_loss, rel=1e-6)
    assert set(client.run(torch.get_num_threads).values()) == {1}


def test_collapsed_fit_with_more_workers_than_one(client, data):
    X, y = data
    partition = partition_contiguous(X, 3)
    spec = LocalFitSpec(num_inducing=6, collapsed=True, kernel="matern32")
    expected = fit_local((X, y, partition), spec, CONFIG)
    fit = fit_local_distributed(client, (X, y, partition), spec, CONFIG)
    assert len(fit.chunks) == 2
    assert_same_modules(expected.modules, fit.modules)


def test_a_given_value_is_settled_per_partition_so_workers_agree(client, data):
    """With restarts every partition is also fitted with the kernel's given values held first
    and keeps the higher bound (``given_first_too``), a choice per partition: two workers
    reproduce the in-process fit. (A periodic part's flat directions pin less tightly than an
    RBF's: ELBOs agree to about 1e-8 relative, and predictions over all inputs, far outside
    a module's partition too, to 3e-4; with one start 4e-5.)"""
    X, y = data
    partition = partition_contiguous(X, 4)
    spec = LocalFitSpec(num_inducing=5, kernel="rbf + periodic(period=2, dims=[0])")
    expected = fit_local((X, y, partition), spec)
    fit = fit_local_distributed(client, (X, y, partition), spec)
    assert len(fit.chunks) == 2
    assert_same_optimum(expected.modules, fit.modules, X, rel=1e-7, atol=1e-3)


def test_worker_errors_reach_the_client(client, data, uneven_partition):
    X, _ = data
    with pytest.raises(DataError, match="0 or 1") as caught:
        fit_local_distributed(client, (X, np.full(len(X), 2.0), uneven_partition),
                              LocalFitSpec(num_inducing=4, likelihood="bernoulli"), CONFIG)
    assert any(entry.name == "fit_chunk" for entry in caught.traceback)


def test_in_process_is_the_default(data, uneven_partition):
    X, y = data
    fit = fit_local_on((X, y, uneven_partition), LocalFitSpec(num_inducing=4),
                       replace(CONFIG, steps=2))
    assert hasattr(fit, "model")


def fit_local_command(tmp_path, data) -> list[str]:
    """``pyrogp fit-local`` of ``data`` written to a CSV, without ``--out``."""
    X, y = data
    path = tmp_path / "data.csv"
    np.savetxt(path, np.column_stack([X, y]), delimiter=",", header="x1,x2,y", comments="")
    return ["fit-local", str(path), "--target", "y", "--partitions", "4", "--partition-by",
            "contiguous", "--inducing", "5", "--seed", "2"]


def test_cli_on_a_running_scheduler_matches_the_in_process_cli(client, tmp_path, data):
    X, y = data
    common = fit_local_command(tmp_path, data)
    assert main([*common, "--out", str(tmp_path / "local")]) == 0
    address = client.scheduler.address
    assert main([*common, "--scheduler", address, "--out", str(tmp_path / "dask")]) == 0
    assert_same_optimum(load_modules(tmp_path / "local"), load_modules(tmp_path / "dask"), X)


def test_cli_workers_runs_an_embedded_cluster(capsys, tmp_path, data, monkeypatch):
    """``--workers 2``: a real two-process Dask cluster started and stopped by the command,
    with the modules of the in-process fit."""
    clusters = []
    real_client = executors.dask_client

    def recording_client(workers=None, scheduler=None):
        clusters.append((workers, scheduler))
        return real_client(workers, scheduler)

    monkeypatch.setattr(executors, "dask_client", recording_client)
    X, y = data
    common = fit_local_command(tmp_path, data)
    assert main([*common, "--out", str(tmp_path / "local")]) == 0
    capsys.readouterr()
    assert main([*common, "--workers", "2", "--out", str(tmp_path / "workers")]) == 0
    assert "4 modules" in capsys.readouterr().out
    assert clusters == [(2, None)]
    assert_same_optimum(load_modules(tmp_path / "local"), load_modules(tmp_path / "workers"), X)


def test_cli_rejects_bad_distribution_options(capsys, tmp_path, monkeypatch, data):
    X, y = data
    path = tmp_path / "data.csv"
    np.savetxt(path, np.column_stack([X, y]), delimiter=",", header="x1,x2,y", comments="")
    common = ["fit-local", str(path), "--target", "y", "--partitions", "2", "--inducing", "3",
              "--steps", "2", "--out", str(tmp_path / "out")]
    assert main([*common, "--workers", "0"]) == 2
    assert "at least 1" in capsys.readouterr().err
    assert main([*common, "--workers", "2", "--scheduler", "tcp://127.0.0.1:1"]) == 2
    monkeypatch.setattr(executors, "CONNECT_TIMEOUT", 1)
    capsys.readouterr()
    assert main([*common, "--scheduler", "tcp://127.0.0.1:1"]) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("pyrogp: error: cannot reach the Dask scheduler") and \
        "\n" not in error
    with pytest.raises(PyrogpError):
        with dask_client(scheduler="tcp://127.0.0.1:1"):
            pass
