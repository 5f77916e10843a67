"""Multitask deep GPs (Boustati, Damoulas & Savage, "Non-linear Multitask Learning with Deep
Gaussian Processes") and their baselines, as batched Pyro models.

- :mod:`.data`: the long/list task data, the per-task layout, stacked and stratified minibatches;
- :mod:`.standardisation`: inputs over all tasks, targets per task;
- :mod:`.options`: the architecture (widths, counts, M, S, initial hyperparameters);
- :mod:`.initialisation`: inducing inputs per task and the fixed linear inner mean;
- :mod:`.processes`: the inner layer — shared and private processes, the latent space λ^t;
- :mod:`.outputs`: the top layer — a GP per task (ARD) or one coregionalised GP;
- :mod:`.task_likelihood`: observations under each row's own task's likelihood;
- :mod:`.noise_correlation`: cGP's noise correlated across the outputs observed at one input;
- :mod:`.model`: the ELBO (eq. 9) by the doubly-stochastic estimator, model/guide, state;
- :mod:`.families`: mMDGP, sMDGP, cMDGP, iDGP, iGP, cGP;
- :mod:`.prediction`: the Gaussian-mixture predictive and the data-units predictor;
- :mod:`.files`: the fitted model and its predictor settings in one signed safetensors file;
- :mod:`.plots`: the Hinton diagram of the ARD weights;
- :mod:`.kernel`: the one helper that makes every process's kernel;
- :mod:`.warm_start`: a deep model started at the fitted shallow model it contains;
- :mod:`.description`: what ``pyrogp info`` tells about a multitask file;
- :mod:`.toy`: the toy example of the paper's Fig. 1 and a transfer toy.
"""

from pyrogp_models.models.multitask.data import (
    TaskBatch,
    TaskData,
    TaskLayout,
    as_task_data,
    full_batch,
    stacked_batch,
    stratified_batch,
    weighted_batch,
)
from pyrogp_models.models.multitask.families import (
    CGP,
    CMDGP,
    IDGP,
    IGP,
    MMDGP,
    MODELS,
    SMDGP,
    build_model,
)
from pyrogp_models.models.multitask.files import load_multitask, save_multitask
from pyrogp_models.models.multitask.initialisation import Initialisation
from pyrogp_models.models.multitask.model import MultitaskGP
from pyrogp_models.models.multitask.options import MultitaskOptions
from pyrogp_models.models.multitask.plots import plot_ard_weights
from pyrogp_models.models.multitask.prediction import (
    Components,
    MultitaskPredictor,
    components,
    joint_components,
    mixture_log_density,
    mixture_moments,
)
from pyrogp_models.models.multitask.standardisation import TaskStandardisation
from pyrogp_models.models.multitask.toy import (
    WARPED_LATENTS,
    toy_functions,
    toy_grid,
    toy_tasks,
    warped_functions,
    warped_gap,
    warped_tasks,
)

__all__ = [
    "CGP", "CMDGP", "IDGP", "IGP", "MMDGP", "MODELS", "SMDGP", "WARPED_LATENTS", "Components",
    "Initialisation",
    "MultitaskGP", "MultitaskOptions", "MultitaskPredictor", "TaskBatch", "TaskData",
    "TaskLayout", "TaskStandardisation", "as_task_data", "build_model", "components",
    "full_batch", "joint_components", "load_multitask", "mixture_log_density", "mixture_moments",
    "plot_ard_weights", "save_multitask", "stacked_batch", "stratified_batch", "toy_functions",
    "toy_grid", "toy_tasks", "warped_functions", "warped_gap", "warped_tasks", "weighted_batch",
]
