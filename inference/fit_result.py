"""What every fit function of the library returns.

``fit_local``, ``recycle``, ``fit_exact_experts`` and ``fit_distributed_kernel`` (and the
multitask fit) take data (or modules), a spec and a
:class:`~pyrogp_models.inference.train_config.TrainConfig`, and return a :class:`Fit`: the
trained Pyro model with its data bound, so that

    pyro.infer.SVI(fit.model.model, fit.model.guide, pyro.optim.Adam({"lr": 0.01}),
                   pyro.infer.TraceMeanField_ELBO()).step()

continues training with no arguments; the training record; and a predictor in data units
(:class:`~pyrogp_models.modules.predictor.Predictor`: ``predict_f``, ``predict_y``,
``log_predictive``, ``to_inference_data``).
"""

from __future__ import annotations

from dataclasses import dataclass

from pyro.nn import PyroModule
from pyrogp_models.inference.trainer import TrainResult

from pyrogp_models.data import Standardisation
from pyrogp_models.modules.predictor import Predictor


@dataclass
class Fit:
    """A trained model (``model``), its training record (``result``), its predictor in data
    units (``predictor``) and the standardisation that maps data units to model units."""

    model: PyroModule
    result: TrainResult
    predictor: Predictor
    standardisation: Standardisation
