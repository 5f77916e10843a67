"""Loading tables, checking values, choosing columns and standardising."""

import json
import re

import numpy as np
import pytest
import torch

from pyrogp_models.data import (
    Standardisation,
    Table,
    load_banana,
    load_sunspots,
    load_table,
    require_finite,
    split_features_target,
)
from pyrogp_models.errors import DataError, PyrogpError


def write(path, text):
    path.write_text(text)
    return path


def test_csv_round_trip(tmp_path):
    values = np.array([[1.5, -2.0, 3e-5], [np.nan, np.inf, -np.inf], [7.0, 0.0, 1e10]])
    path = tmp_path / "data.csv"
    np.savetxt(path, values, delimiter=",", header="a,b,c", comments="", fmt="%.17g")
    table = load_table(path)
    assert table.columns == ["a", "b", "c"]
    assert table.values.dtype == np.float64
    np.testing.assert_array_equal(table.values, values)
    np.testing.assert_array_equal(table.column("b"), values[:, 1])
    np.testing.assert_array_equal(table.select(["c", "a"]), values[:, [2, 0]])


def test_csv_tolerates_spaces_blank_lines_and_a_byte_order_mark(tmp_path):
    path = tmp_path / "data.csv"
    path.write_text("\ufeffx, y\n1, 2\n\n3 ,4\n", encoding="utf-8")
    table = load_table(path)
    assert table.columns == ["x", "y"]
    np.testing.assert_array_equal(table.values, [[1.0, 2.0], [3.0, 4.0]])


def test_empty_csv_cells_are_missing_values_that_the_column_checks_name(tmp_path):
    gaps = load_table(write(tmp_path / "gaps.csv", "x,y\n1,2\n3, \n,6\n"))
    np.testing.assert_array_equal(np.isnan(gaps.values), [[0, 0], [0, 1], [1, 0]])
    for text, message in (
        ("x,y\n1,2\n3, \n5,6\n", "column 'y' contains NaN or inf (first at row 2)"),
        ("x,y\n1,2\n3,4\n,6\n", "column 'x' contains NaN or inf (first at row 3)"),
    ):
        with pytest.raises(DataError, match=f"^{re.escape(message)}$"):
            split_features_target(load_table(write(tmp_path / "one.csv", text)), "y")


def test_npz_round_trip(tmp_path):
    path = tmp_path / "data.npz"
    a = np.arange(4.0)
    b = np.arange(4).reshape(4, 1) * 10
    c = np.arange(12.0).reshape(4, 3) + 0.5
    np.savez(path, a=a, b=b, c=c)
    table = load_table(path)
    assert table.columns == ["a", "b", "c0", "c1", "c2"]
    np.testing.assert_array_equal(table.values, np.column_stack([a, b, c]))
    np.testing.assert_array_equal(table.select(["c1"])[:, 0], c[:, 1])


@pytest.mark.parametrize(
    ("name", "text", "pattern"),
    [
        ("empty.csv", "", "empty file"),
        ("header.csv", "a,b\n", "no data rows"),
        ("ragged.csv", "a,b\n1,2\n3,4,5\n", "row 2 .*has 3 values but the header has 2"),
        ("twice.csv", "a,a\n1,2\n", "duplicate column names: a"),
        ("data.txt", "a\n1\n", "unknown data file extension '.txt'"),
    ],
)
def test_bad_csv_files(tmp_path, name, text, pattern):
    path = write(tmp_path / name, text)
    with pytest.raises(DataError, match=pattern) as caught:
        load_table(path)
    message = str(caught.value)
    assert str(path) in message and "\n" not in message


def test_a_text_column_is_kept_and_refused_only_where_it_is_used_as_numbers(tmp_path):
    path = write(tmp_path / "words.csv", "a,b,when\n1,2,2020-01\n3,NA,2020-02\n,4,x\n")
    table = load_table(path)
    np.testing.assert_array_equal(table.column("a"), [1.0, 3.0, np.nan])
    np.testing.assert_array_equal(table.column("b"), [2.0, np.nan, 4.0])  # NA is missing
    assert table.labels("when") == ["2020-01", "2020-02", "x"] and table.labels("a") is None
    for use in (lambda: table.column("when"), lambda: table.select(["a", "when"])):
        with pytest.raises(DataError, match="non-numeric value '2020-01' in column 'when' "
                                            r"at row 1 \(line 2\)") as caught:
            use()
        assert str(path) in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.parametrize("cell", ["", "NA", "na", " N/A ", "#N/A", "NULL", "None", "<NA>", "nan"])
def test_every_usual_spelling_of_a_missing_cell_is_nan(tmp_path, cell):
    table = load_table(write(tmp_path / "gaps.csv", f"a,b\n1,2\n3,{cell}\n"))
    np.testing.assert_array_equal(table.column("b"), [2.0, np.nan])


def test_missing_file(tmp_path):
    with pytest.raises(DataError, match="data file not found: .*nowhere.csv"):
        load_table(tmp_path / "nowhere.csv")


def test_bad_npz_files(tmp_path):
    ragged = tmp_path / "ragged.npz"
    np.savez(ragged, a=np.zeros(3), b=np.zeros(4))
    with pytest.raises(DataError, match="different numbers of rows .*a: 3, b: 4"):
        load_table(ragged)
    words = tmp_path / "words.npz"
    np.savez(words, a=np.array(["x", "y"]))
    with pytest.raises(DataError, match="array 'a' is not numeric"):
        load_table(words)
    cube = tmp_path / "cube.npz"
    np.savez(cube, a=np.zeros((2, 2, 2)))
    with pytest.raises(DataError, match=r"array 'a' has shape \(2, 2, 2\)"):
        load_table(cube)
    empty = tmp_path / "empty.npz"
    np.savez(empty)
    with pytest.raises(DataError, match="empty file"):
        load_table(empty)
    no_rows = tmp_path / "no_rows.npz"
    np.savez(no_rows, a=np.zeros(0))
    with pytest.raises(DataError, match="no data rows"):
        load_table(no_rows)
    broken = write(tmp_path / "broken.npz", "not a zip archive")
    with pytest.raises(DataError, match="not a readable .npz file"):
        load_table(broken)


def test_unknown_column_lists_the_available_ones():
    table = Table(["a", "b", "c"], np.zeros((2, 3)))
    with pytest.raises(DataError, match=r"^unknown column 'x'; available: a, b, c$"):
        table.column("x")
    with pytest.raises(DataError, match="unknown column 'x'"):
        table.select(["a", "x"])


def test_errors_belong_to_the_library_hierarchy():
    assert issubclass(DataError, PyrogpError) and issubclass(DataError, ValueError)


def test_require_finite_names_the_first_bad_row():
    require_finite(np.ones((3, 2)), "inputs")
    values = np.ones((5, 2))
    values[3, 1] = np.nan
    values[4, 0] = np.inf
    with pytest.raises(DataError, match=r"^inputs contains NaN or inf \(first at row 4\)$"):
        require_finite(values, "inputs")
    with pytest.raises(DataError, match=r"first at row 2\)"):
        require_finite(torch.tensor([0.0, -float("inf")], dtype=torch.float32), "outputs")


def test_split_features_target_defaults_and_choices():
    table = Table(["t", "x1", "id", "x2"], np.arange(12.0).reshape(3, 4))
    X, y = split_features_target(table, "t", exclude=["id"])
    np.testing.assert_array_equal(X, table.values[:, [1, 3]])
    np.testing.assert_array_equal(y, table.values[:, 0])
    X, _ = split_features_target(table, "t", features=["x2"])
    np.testing.assert_array_equal(X, table.values[:, [3]])
    X, _ = split_features_target(table, "t")
    assert X.shape == (3, 3)


def test_split_features_target_checks_only_the_columns_it_returns():
    values = np.arange(12.0).reshape(3, 4)
    values[1, 2] = np.nan
    table = Table(["t", "x1", "id", "x2"], values)
    split_features_target(table, "t", exclude=["id"])
    with pytest.raises(DataError, match=r"column 'id' contains NaN or inf \(first at row 2\)"):
        split_features_target(table, "t")
    values[2, 0] = np.inf
    with pytest.raises(DataError, match="column 't' contains NaN or inf"):
        split_features_target(Table(["t", "x1", "id", "x2"], values), "t", features=["x1"])


def test_split_features_target_rejects_confusing_requests():
    table = Table(["t", "x"], np.zeros((2, 2)))
    with pytest.raises(DataError, match="unknown column 'y'"):
        split_features_target(table, "y")
    with pytest.raises(DataError, match="unknown column 'typo'"):
        split_features_target(table, "t", exclude=["typo"])
    with pytest.raises(DataError, match="target column 't' is also listed as a feature"):
        split_features_target(table, "t", features=["x", "t"])
    with pytest.raises(DataError, match="no feature columns"):
        split_features_target(table, "t", exclude=["x"])


def test_standardisation_maps_to_zero_mean_unit_scale_and_back():
    rng = np.random.default_rng(0)
    X = rng.normal([3.0, -2.0, 5.0], [2.0, 0.5, 0.0], size=(200, 3))
    y = rng.normal(10.0, 4.0, size=200)
    standardisation = Standardisation.fit(X, y)
    Xs = standardisation.transform_x(X)
    np.testing.assert_allclose(Xs.mean(axis=0), 0.0, atol=1e-12)
    np.testing.assert_allclose(Xs.std(axis=0), [1.0, 1.0, 0.0], atol=1e-12)
    assert standardisation.x_scale[2] == 1.0
    ys = standardisation.transform_y(y)
    assert abs(ys.mean()) < 1e-12 and abs(ys.std() - 1.0) < 1e-12
    np.testing.assert_allclose(standardisation.inverse_y_mean(ys), y)
    np.testing.assert_allclose(standardisation.inverse_y_var(np.var(ys)), np.var(y))


def test_standardisation_without_y_leaves_outputs_alone():
    X = np.array([[1.0], [3.0]])
    for standardisation in (
        Standardisation.fit(X),
        Standardisation.fit(X, np.array([5.0, 9.0]), standardise_y=False),
    ):
        assert standardisation.y_mean == 0.0 and standardisation.y_scale == 1.0
        np.testing.assert_array_equal(standardisation.transform_x(X), [[-1.0], [1.0]])


def test_standardisation_on_tensors_keeps_dtype_and_device():
    X = torch.tensor([[1.0, 10.0], [3.0, 30.0]], dtype=torch.float32)
    standardisation = Standardisation.fit(X, torch.tensor([0.0, 2.0]))
    Xs = standardisation.transform_x(X)
    assert isinstance(Xs, torch.Tensor) and Xs.dtype == torch.float32 and Xs.device == X.device
    torch.testing.assert_close(Xs, torch.tensor([[-1.0, -1.0], [1.0, 1.0]], dtype=torch.float32))
    mean = standardisation.inverse_y_mean(torch.tensor([1.0], dtype=torch.float64))
    assert mean.dtype == torch.float64 and mean.item() == 2.0


def test_standardisation_json_round_trip():
    standardisation = Standardisation.fit(np.array([[1.0, 2.0], [4.0, 8.0]]), np.array([1.0, 3.0]))
    restored = Standardisation.from_dict(json.loads(json.dumps(standardisation.to_dict())))
    np.testing.assert_array_equal(restored.x_mean, standardisation.x_mean)
    np.testing.assert_array_equal(restored.x_scale, standardisation.x_scale)
    assert (restored.y_mean, restored.y_scale) == (standardisation.y_mean, standardisation.y_scale)


def test_standardisation_rejects_non_finite_inputs():
    with pytest.raises(DataError, match="inputs contains NaN or inf"):
        Standardisation.fit(np.array([[1.0], [np.nan]]))


def test_bundled_sunspots():
    table = load_sunspots()
    assert table.columns == ["year", "month", "sunspots", "sd"]
    assert table.values.shape == (3196, 4)
    assert np.isfinite(table.values).all()
    assert table.values[0, :2].tolist() == [1749, 1] and table.values[-1, :2].tolist() == [2015, 4]
    months = table.column("year") * 12 + table.column("month")
    assert (np.diff(months) == 1).all()


def test_bundled_banana():
    table = load_banana()
    assert table.columns == ["x1", "x2", "label"]
    assert table.values.shape == (5300, 3)
    assert np.isfinite(table.values).all()
    assert set(np.unique(table.column("label"))) == {0.0, 1.0}
