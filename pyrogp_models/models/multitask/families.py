"""The multitask models of Boustati et al. (Sec. 2.3 and Sec. 4): three multitask deep GPs and
three baselines, each a :class:`~pyrogp_models.models.multitask.model.MultitaskGP` that builds
its layers from the options and the initialisation.

=========  ======================================================  ================================
kind       inner layer (latent space λ^t)                          top layer
=========  ======================================================  ================================
``mmdgp``  I shared + J private processes per task, concatenated   a GP per task, ARD (eq. 10)
``smdgp``  I shared processes                                      a GP per task, ARD
``cmdgp``  Q shared latent GPs mixed per task, λ^t = m + A^t u     one coregionalised GP
``idgp``   J private processes per task (a DS-DGP per task)        a GP per task, ARD
``igp``    —                                                       a GP per task on x (SVGP)
``cgp``    —                                                       one coregionalised GP on x
=========  ======================================================  ================================
"""

from __future__ import annotations

import math

import torch

from pyrogp_models.layers import ClosedFormGradients
from pyrogp_models.models.multitask.initialisation import Initialisation
from pyrogp_models.models.multitask.model import MultitaskGP
from pyrogp_models.models.multitask.options import MultitaskOptions
from pyrogp_models.models.multitask.outputs import CoregionalisedGP, TaskGPs
from pyrogp_models.models.multitask.processes import (
    ConcatenatedLatents,
    CoregionalisedLatents,
    ProcessBlock,
)

#: One line per model kind (Boustati, Damoulas & Savage, "Non-linear Multitask Learning with
#: Deep Gaussian Processes", Sec. 2.3 and 4).
SUMMARIES = {
    "smdgp": "shared multitask DGP: shared latent processes, an ARD GP per task on top",
    "mmdgp": "multiprocess multitask DGP: shared + private latent processes, an ARD GP per task",
    "cmdgp": "coregionalised multitask DGP: task-mixed shared latents, one coregionalised GP",
    "idgp": "independent 2-layer deep GPs, one per task (baseline)",
    "igp": "independent sparse GPs, one per task (baseline)",
    "cgp": "one coregionalised sparse GP over all tasks, LMC or ICM, noise correlated across "
           "the outputs at one input (the default model)",
}


class _Layers:
    """Builders of the layers from resolved options and an initialisation."""

    def __init__(self, options: MultitaskOptions, init: Initialisation, num_latent: int):
        self.options, self.init, self.num_latent = options, init, num_latent

    def mean_weights(self, width: int) -> torch.Tensor | None:
        return self.init.mean_weights(width) if self.options.inner_mean == "linear" else None

    def block(self, inducing: torch.Tensor, width: int, kind: str,
              mean_weights: torch.Tensor | None) -> ProcessBlock:
        """Inner processes with the ``kind`` ("shared" or "private") kernel initialisation."""
        options = self.options
        return ProcessBlock(inducing.clone(), width,
                            lengthscale=getattr(options, f"{kind}_lengthscale"),
                            variance=getattr(options, f"{kind}_variance"),
                            ard=options.inner_ard, mean_weights=mean_weights,
                            q_scale=options.q_scale, jitter=options.jitter,
                            learn_inducing=options.learn_inducing)

    def concatenated(self) -> ConcatenatedLatents:
        """I shared processes on M inducing inputs of all tasks, J private ones per task."""
        options, init = self.options, self.init
        shared_inducing = init.shared_inducing
        shared = None if not options.num_shared else self.block(
            shared_inducing.expand(options.num_shared, *shared_inducing.shape),
            options.shared_width, "shared", self.mean_weights(options.shared_width))
        private = None if not options.num_private else self.block(
            init.inducing.unsqueeze(1).expand(-1, options.num_private, -1, -1),
            options.private_width, "private", self.mean_weights(options.private_width))
        return ConcatenatedLatents(shared, private)

    def latent_weights(self) -> torch.Tensor:
        """The linear map x ↦ λ of the inner layer's fixed means [D, D^λ] (the blocks' columns
        in order)."""
        options, init = self.options, self.init
        return torch.cat([init.mean_weights(options.shared_width)] * options.num_shared
                         + [init.mean_weights(options.private_width)] * options.num_private, -1)

    def task_gps(self, inducing: torch.Tensor) -> TaskGPs:
        options = self.options
        return TaskGPs(inducing.clone(), self.num_latent, lengthscale=options.top_lengthscale,
                       variance=options.top_variance, jitter=options.jitter,
                       learn_inducing=options.learn_inducing,
                       linear_mean=options.top_mean == "linear")

    def coregionalised_gp(self, inducing: torch.Tensor) -> CoregionalisedGP:
        options, rank = self.options, self.options.coregional_rank
        return CoregionalisedGP(inducing, self.num_latent,
                                self.init.normal(self.init.num_tasks, rank,
                                                 scale=1 / math.sqrt(rank)),
                                icm=options.coregionalisation == "icm",
                                lengthscale=options.top_lengthscale,
                                variance=options.top_variance, jitter=options.jitter,
                                learn_inducing=options.learn_inducing,
                                joint=self.num_latent == 1)


class MMDGP(MultitaskGP):
    """Multiprocess multitask DGP: shared and private processes, concatenated, and an ARD GP per
    task on top (Sec. 2.3)."""

    kind = "mmdgp"

    def build_layers(self, options, init):
        layers = _Layers(options, init, self.num_latent)
        return layers.concatenated(), layers.task_gps(init.inducing @ layers.latent_weights())


class SMDGP(MMDGP):
    """Shared multitask DGP: shared processes only; the per-task ARD weights segment the shared
    latent space softly (Sec. 2.3)."""

    kind = "smdgp"


class IDGP(MMDGP):
    """Independent doubly-stochastic 2-layer DGPs, one per task (Salimbeni & Deisenroth 2017):
    private processes only."""

    kind = "idgp"


class CMDGP(MultitaskGP):
    """Coregionalised multitask DGP: λ^t(x) = m(x) + A^t u(x) with Q shared latent GPs u_q, and
    one coregionalised GP on top (Sec. 2.3)."""

    kind = "cmdgp"

    def build_layers(self, options, init):
        layers = _Layers(options, init, self.num_latent)
        width, count = options.inner_width, options.num_coregional
        shared = init.shared_inducing
        # ICM: one process with Q outputs (one kernel); LMC: Q processes with one output each
        processes, outputs = (1, count) if options.coregionalisation == "icm" else (count, 1)
        block = layers.block(shared.expand(processes, *shared.shape), outputs, "shared", None)
        latent = CoregionalisedLatents(block, init.normal(init.num_tasks, width, count,
                                                          scale=1 / math.sqrt(count)),
                                       layers.mean_weights(width))
        return latent, layers.coregionalised_gp(shared @ init.mean_weights(width))


class IGP(MultitaskGP):
    """Independent SVGPs, one per task (Hensman et al. 2013), as a single-layer model."""

    kind = "igp"
    inducing_on_inputs = "task"

    def build_layers(self, options, init):
        return None, _Layers(options, init, self.num_latent).task_gps(init.inducing)

    def task_elbos(self) -> torch.Tensor:
        """Every task's ELBO on all its rows [T]."""
        return self.data_terms() - self.top.task_kl()

    def natural_gradient_objectives(self) -> list:
        """The top layer, conjugate for a Gaussian likelihood (its gradients in closed form),
        else safeguarded per task."""
        gaussian = self.likelihood.name == "gaussian"
        return [(self.top.layer, ClosedFormGradients(self.top_data_gradients) if gaussian
                 else self.task_elbos)]


class CGP(MultitaskGP):
    """Multitask SVGP with an ICM (or LMC) kernel, heterotopic: every row evaluated at its own
    task only (Nguyen & Bonilla 2014); by default with noise correlated across the outputs
    observed at one input (:mod:`.noise_correlation`)."""

    kind = "cgp"
    inducing_on_inputs = "shared"

    def build_layers(self, options, init):
        return None, _Layers(options, init, self.num_latent).coregionalised_gp(
            init.shared_inducing)

    def natural_gradient_objectives(self) -> list:
        """The R latent GPs are coupled through the mixing: with one joint q over them and a
        Gaussian likelihood the top layer is conjugate (its gradients in closed form);
        otherwise every step is safeguarded by the whole ELBO."""
        conjugate = (self.likelihood.name == "gaussian"
                     and self.top.layer.covariance == "joint")
        return [(self.top.layer, ClosedFormGradients(self.top_data_gradients) if conjugate
                 else self.elbo)]


#: The model classes by kind.
MODELS: dict[str, type[MultitaskGP]] = MultitaskGP.registry


def build_model(kind: str, data, options: MultitaskOptions | None = None,
                inducing_init: str = "kmeans", generator: torch.Generator | None = None,
                name: str | None = None) -> MultitaskGP:
    """A model of ``kind`` initialised from ``data`` (a
    :class:`~pyrogp_models.models.multitask.data.TaskData` in model units) and bound to it."""
    if kind not in MODELS:
        raise ValueError(f"unknown multitask model '{kind}'; choose from {sorted(MODELS)}")
    options = (options or MultitaskOptions()).with_inducing_for(
        torch.bincount(data.task, minlength=data.num_tasks).tolist())
    init = Initialisation.from_data(data, options.num_inducing, inducing_init, generator)
    return MODELS[kind](options, init, data, name)
