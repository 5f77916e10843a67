"""The sparse-GP layer every model is built from (:mod:`.sparse_gp`), the closed-form gradients
a model may declare for it (:mod:`.conjugate`) and the naming of Pyro modules (:mod:`.naming`)."""

from pyrogp_models.layers.conjugate import ClosedFormGradients
from pyrogp_models.layers.naming import unique_name
from pyrogp_models.layers.sparse_gp import OneLayer, SparseGPLayer, variational_layers

__all__ = ["ClosedFormGradients", "OneLayer", "SparseGPLayer", "unique_name", "variational_layers"]
