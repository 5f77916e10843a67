"""Degenerate data are refused in one line, from the API and from the command line: constant
targets, fewer rows than a GP fit identifies its hyperparameters from, and inputs that are all
copies of one point — for the whole data (exact experts, one partition) and for any partition of
a local fit. Rows are numbered from 1 in every message."""

import numpy as np
import pytest
from pyrogp_models.inference.experts_fit import ExpertsSpec, fit_exact_experts
from pyrogp_models.inference.local_fit import LocalFitSpec, fit_local

from helpers import run_failing, write_csv
from pyrogp_models.data.identifiability import MIN_DISTINCT_INPUTS, require_identifiable
from pyrogp_models.data.partitioners import Partition, partition_contiguous, partition_random
from pyrogp_models.errors import DataError

rng = np.random.default_rng(0)
X = np.sort(rng.uniform(0, 10, (40, 1)), axis=0)
Y = np.sin(X[:, 0]) + 0.1 * rng.standard_normal(40)

DEGENERATE = {  # (X, y, message)
    "constant targets": (X, np.full(40, 2.5), "constant targets (all 2.5)"),
    "one row": (X[:1], Y[:1], "have 1 row; a GP fit needs at least 3 rows with distinct inputs"),
    "two rows": (X[:2], Y[:2], "have 2 rows; a GP fit needs at least 3"),
    "all-duplicate inputs": (np.full((30, 1), 4.0), Y[:30],
                             "have 30 rows with 1 distinct input; a GP fit needs at least 3"),
    "two distinct inputs": (np.repeat([[1.0], [2.0]], 10, axis=0), Y[:20],
                            "have 20 rows with 2 distinct inputs"),
}


def one_partition(n: int) -> Partition:
    return Partition(np.zeros(n, dtype=np.int64), {"kind": "random", "num_partitions": 1})


@pytest.mark.parametrize("case", DEGENERATE)
def test_a_local_fit_refuses_degenerate_data(case):
    X_, y, message = DEGENERATE[case]
    with pytest.raises(DataError, match=message.replace("(", r"\(").replace(")", r"\)")):
        fit_local((X_, y, one_partition(len(y))), LocalFitSpec(num_inducing=1))


@pytest.mark.parametrize("case", DEGENERATE)
def test_exact_experts_refuse_degenerate_data(case):
    X_, y, message = DEGENERATE[case]
    with pytest.raises(DataError, match=message.replace("(", r"\(").replace(")", r"\)")):
        fit_exact_experts((X_, y, one_partition(len(y))), ExpertsSpec())


def test_a_local_fit_names_the_degenerate_partition():
    partition = partition_contiguous(X, 4)
    y = Y.copy()
    y[partition.assignments == 2] = 1.0
    with pytest.raises(DataError, match=r"^partition 2 has constant targets \(all 1\): .*; use "
                                        "fewer partitions$"):
        fit_local((X, y, partition), LocalFitSpec(num_inducing=3))
    assignments = np.zeros(40, dtype=np.int64)
    assignments[[5, 30]] = 1  # two points in partition 1
    with pytest.raises(DataError, match="^partition 1 has 2 rows; a GP fit needs at least 3"):
        fit_local((X, Y, Partition(assignments, {"kind": "random", "num_partitions": 2})),
                  LocalFitSpec(num_inducing=2))


def test_labels_may_be_constant_within_a_partition():
    """Classification partitions of one class are common (a block of a series): only Gaussian
    targets are refused when constant."""
    partition = partition_contiguous(X, 2)
    labels = (partition.assignments == 1).astype(float)
    fit_local((X, labels, partition), LocalFitSpec(num_inducing=3, likelihood="bernoulli"),
              replace_steps(5))


def replace_steps(steps):
    from pyrogp_models.inference.trainer import TrainConfig
    return TrainConfig(steps=steps, tol=None, natural_gradient_lr=1.0)


def test_experts_identify_shared_hyperparameters_from_all_rows():
    """Experts of one or two points are fine: their shared hyperparameters see every row."""
    fit = fit_exact_experts((X[:12], Y[:12], partition_random(12, 6, 0)))
    assert all(module.num_data == 2 for module in fit.modules.values())


def test_the_rule_counts_distinct_rows_per_partition():
    partition = Partition(np.array([0, 0, 0, 1, 1, 1]), {"kind": "random", "num_partitions": 2})
    inputs = np.array([[0.0, 1.0], [0.0, 2.0], [1.0, 1.0], [3.0, 3.0], [3.0, 3.0], [3.0, 4.0]])
    targets = np.arange(6.0)
    require_identifiable(inputs[:3], targets[:3])
    with pytest.raises(DataError, match="partition 1 has 3 rows with 2 distinct inputs"):
        require_identifiable(inputs, targets, partition)
    assert MIN_DISTINCT_INPUTS == 3


# From the command line ------------------------------------------------------------------------
def csv_of(tmp_path, X_, y):
    return write_csv(tmp_path / "data.csv", {"x": X_[:, 0], "y": y})


@pytest.mark.parametrize("case", DEGENERATE)
@pytest.mark.parametrize("command", [
    ["fit-local", "--partitions", "1", "--inducing", "1"],
    ["fit-experts", "--experts", "1"],
])
def test_the_command_line_refuses_degenerate_data_in_one_line(case, command, capsys, tmp_path):
    X_, y, message = DEGENERATE[case]
    data = csv_of(tmp_path, X_, y)
    error = run_failing(capsys, command[0], data, "--target", "y", *command[1:], "--out",
                        tmp_path / "out")
    assert message in error
    assert "learning rate" not in error
    assert sorted(path.name for path in tmp_path.iterdir()) == ["data.csv"]  # nothing written


def test_rows_are_numbered_from_one_in_every_message(capsys, tmp_path):
    """The file reader (a non-numeric cell) and the finiteness check (NaN) name the same row."""
    for bad, message in (("oops", "non-numeric value 'oops' in column 'y' at row 3"),
                         ("nan", "column 'y' contains NaN or inf (first at row 3)")):
        lines = ["x,y", "0,1.0", "1,2.0", f"2,{bad}", "3,0.5", "4,0.1"]
        (tmp_path / "rows.csv").write_text("\n".join(lines) + "\n")
        error = run_failing(capsys, "fit-local", tmp_path / "rows.csv", "--target", "y",
                            "--partitions", "1", "--inducing", "2", "--out", tmp_path / "out")
        assert message in error
