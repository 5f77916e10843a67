"""Data: tables and bundled data sets, standardisation, partitioners, k-means and inducing
inputs."""

from pyrogp_models.data.standardisation import Standardisation
from pyrogp_models.data.tables import (
    Table,
    load_banana,
    load_sunspots,
    load_table,
    require_finite,
    split_features_target,
)

__all__ = ["Standardisation", "Table", "load_banana", "load_sunspots", "load_table",
           "require_finite", "split_features_target"]
