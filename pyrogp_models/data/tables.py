"""Tabular data: loading CSV/NPZ files, checking values and choosing columns."""

from __future__ import annotations

import csv
import math
import zipfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import numpy as np
import torch

from pyrogp_models.errors import DataError

ArrayLike = np.ndarray | torch.Tensor


#: Cells read as a missing value (NaN) in a numeric CSV column, compared without case and
#: surrounding spaces: what pandas, R and spreadsheets write for one.
MISSING_CELLS = frozenset({"", "na", "n/a", "#n/a", "nan", "null", "none", "<na>"})


def is_missing(cell: str) -> bool:
    """Whether a CSV cell writes a missing value (:data:`MISSING_CELLS`)."""
    return cell.strip().lower() in MISSING_CELLS


def _number(cell: str) -> float:
    """A numeric CSV cell's value, NaN for a missing one; ValueError for text."""
    return math.nan if is_missing(cell) else float(cell)


@dataclass(frozen=True)
class TextColumn:
    """A CSV column that is not all numbers: its cells, and the one-line error that using it as
    numbers raises (naming its first non-numeric cell)."""

    cells: list[str]
    problem: str


@dataclass(frozen=True, eq=False)
class Table:
    """Named float64 columns: ``values[:, j]`` holds column ``columns[j]``. A CSV column that is
    not all numbers is NaN there and kept in ``text``: asking for it as numbers raises its
    error, so a table may carry dates or names in columns no command uses, and a long-form
    multitask table may name its tasks (:meth:`labels`)."""

    columns: list[str]
    values: np.ndarray
    text: dict[str, TextColumn] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.values.ndim != 2 or self.values.shape[1] != len(self.columns):
            raise DataError(
                f"table values of shape {self.values.shape} do not match "
                f"{len(self.columns)} column names"
            )
        duplicates = sorted({name for name in self.columns if self.columns.count(name) > 1})
        if duplicates:
            raise DataError(f"duplicate column names: {', '.join(duplicates)}")

    @property
    def num_rows(self) -> int:
        return self.values.shape[0]

    def column(self, name: str) -> np.ndarray:
        """The column called ``name`` as a float64 array of shape [N]."""
        return self.values[:, self._index(name)]

    def select(self, names: Sequence[str]) -> np.ndarray:
        """The columns ``names`` in that order, as a float64 array of shape [N, len(names)]."""
        return self.values[:, [self._index(name) for name in names]]

    def labels(self, name: str) -> list[str] | None:
        """The cells of column ``name`` as written (stripped) if it is a text column, else None
        (read it with :meth:`column`)."""
        self._index(name, numeric=False)
        return [cell.strip() for cell in self.text[name].cells] if name in self.text else None

    def _index(self, name: str, numeric: bool = True) -> int:
        if name not in self.columns:
            raise DataError(f"unknown column '{name}'; available: {', '.join(self.columns)}")
        if numeric and name in self.text:
            raise DataError(self.text[name].problem)
        return self.columns.index(name)


def load_table(path: str | Path) -> Table:
    """Read a CSV file with a header row, or an ``.npz`` file of arrays, into a ``Table``.

    NaN and inf are kept, and a CSV cell of :data:`MISSING_CELLS` (empty, ``NA``, ``NULL``, …:
    how pandas, R and spreadsheets write a missing value) is read as NaN: callers check the
    columns they use with ``require_finite``; a wide-form multitask table reads NaN as an output
    not observed on that row. A column that is not all numbers is kept as text
    (:class:`Table`)."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"data file not found: {path}")
    suffix = path.suffix.lower()
    if suffix == ".csv":
        return _load_csv(path)
    if suffix == ".npz":
        return _load_npz(path)
    raise DataError(f"{path}: unknown data file extension '{path.suffix}'; use .csv or .npz")


def _load_csv(path: Path) -> Table:
    with path.open(newline="", encoding="utf-8-sig") as handle:
        lines = [(number, row) for number, row in enumerate(csv.reader(handle), start=1) if row]
    if not lines:
        raise DataError(f"{path}: empty file (no header row)")
    columns = [name.strip() for name in lines[0][1]]
    body = lines[1:]
    if not body:
        raise DataError(f"{path}: no data rows after the header")
    for row_number, (line_number, row) in enumerate(body, start=1):
        if len(row) != len(columns):
            raise DataError(
                f"{path}: row {row_number} (line {line_number}) has {len(row)} values "
                f"but the header has {len(columns)} columns"
            )
    try:  # every cell a number: one conversion
        values, text = np.array([row for _, row in body], dtype=np.float64), {}
    except ValueError:
        values, text = _read_columns(path, columns, body)
    try:
        return Table(columns, values, text)
    except DataError as error:
        raise DataError(f"{path}: {error}") from None


def _read_columns(path: Path, columns: list[str], body: list[tuple[int, list[str]]]
                  ) -> tuple[np.ndarray, dict[str, TextColumn]]:
    """Column by column: numbers, with :data:`MISSING_CELLS` as NaN, or a :class:`TextColumn`."""
    values, text = np.empty((len(body), len(columns))), {}
    for j, name in enumerate(columns):
        cells = [row[j] for _, row in body]
        try:
            values[:, j] = [_number(cell) for cell in cells]
        except ValueError:
            values[:, j] = math.nan
            text[name] = TextColumn(cells, _first_non_numeric(path, name, body, j))
    return values, text


def _first_non_numeric(path: Path, name: str, body: list[tuple[int, list[str]]], j: int) -> str:
    for row_number, (line_number, row) in enumerate(body, start=1):
        try:
            _number(row[j])
        except ValueError:
            return (f"{path}: non-numeric value {row[j]!r} in column '{name}' "
                    f"at row {row_number} (line {line_number})")
    raise AssertionError("a column that failed to convert has a non-numeric cell")


def _load_npz(path: Path) -> Table:
    try:
        with np.load(path, allow_pickle=False) as archive:
            arrays = {key: archive[key] for key in archive.files}
    except (OSError, ValueError, zipfile.BadZipFile) as error:
        raise DataError(f"{path}: not a readable .npz file ({error})") from None
    if not arrays:
        raise DataError(f"{path}: empty file (no arrays)")
    columns: list[str] = []
    blocks: list[np.ndarray] = []
    for key, array in arrays.items():
        if array.dtype.kind not in "biuf":
            raise DataError(f"{path}: array '{key}' is not numeric (dtype {array.dtype})")
        if array.ndim == 1:
            array = array[:, None]
        if array.ndim != 2:
            raise DataError(
                f"{path}: array '{key}' has shape {array.shape}; expected [N] or [N, D]"
            )
        width = array.shape[1]
        columns.extend([key] if width == 1 else [f"{key}{j}" for j in range(width)])
        blocks.append(array.astype(np.float64))
    lengths = {key: block.shape[0] for key, block in zip(arrays, blocks, strict=True)}
    if len(set(lengths.values())) > 1:
        described = ", ".join(f"{key}: {length}" for key, length in lengths.items())
        raise DataError(f"{path}: arrays have different numbers of rows ({described})")
    values = np.concatenate(blocks, axis=1)
    if values.shape[0] == 0:
        raise DataError(f"{path}: no data rows")
    try:
        return Table(columns, values)
    except DataError as error:
        raise DataError(f"{path}: {error}") from None


def require_finite(array: ArrayLike, what: str) -> None:
    """Raise ``DataError`` if ``array`` holds NaN or inf, naming the first such row counted from 1
    along axis 0 (as the file readers count data rows)."""
    finite = np.isfinite(np.atleast_1d(as_float64_numpy(array)))
    bad_rows = np.flatnonzero(~finite.all(axis=tuple(range(1, finite.ndim))))
    if bad_rows.size:
        raise DataError(f"{what} contains NaN or inf (first at row {int(bad_rows[0]) + 1})")


def split_features_target(
    table: Table,
    target: str,
    features: Sequence[str] | None = None,
    exclude: Iterable[str] = (),
) -> tuple[np.ndarray, np.ndarray]:
    """Inputs ``X`` [N, D] and outputs ``y`` [N] from a table, both checked to be finite.

    Without ``features``, every column except ``target`` and those in ``exclude`` is a feature.
    """
    y = table.column(target)
    excluded = set(exclude)
    for name in excluded:
        table.column(name)
    if features is None:
        features = [name for name in table.columns if name != target and name not in excluded]
    elif target in features:
        raise DataError(f"the target column '{target}' is also listed as a feature")
    if not features:
        raise DataError(f"no feature columns left besides the target '{target}'")
    X = table.select(features)
    for j, name in enumerate(features):
        require_finite(X[:, j], f"column '{name}'")
    require_finite(y, f"column '{target}'")
    return X, y.copy()


def as_float64_numpy(array: ArrayLike) -> np.ndarray:
    """``array`` (a tensor is detached and moved to the CPU) as a float64 numpy array of the same
    shape."""
    if isinstance(array, torch.Tensor):
        array = array.detach().cpu().double().numpy()
    return np.asarray(array, dtype=np.float64)


def load_sunspots() -> Table:
    """Monthly mean sunspot numbers 1749-01 to 2015-04: columns year, month, sunspots, sd."""
    return _load_bundled("nasa_sunspots.csv")


def load_banana() -> Table:
    """The banana classification benchmark: columns x1, x2, label (0/1)."""
    return _load_bundled("banana.csv")


def _load_bundled(name: str) -> Table:
    with resources.as_file(resources.files("pyrogp_models.data") / "datasets" / name) as path:
        return load_table(path)
