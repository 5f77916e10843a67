"""A Hinton diagram of the top layer's ARD weights (Boustati et al., Figs. 5 and 6): one row per
task, one column per latent dimension, squares of area proportional to ω_td / max ω. matplotlib
is imported when a plot is drawn."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch


def plot_ard_weights(weights: torch.Tensor | np.ndarray, ax=None,
                     row_labels: Sequence[str] | None = None,
                     column_labels: Sequence[str] | None = None, shared_columns: int = 0):
    """Draw ``weights`` [T, D^λ] (e.g. ``model.ard_weights()``) as a Hinton diagram on ``ax``
    (a new figure if None); the first ``shared_columns`` columns (shared processes) are drawn in
    one colour, the rest (private processes) in another. Returns the axes."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    values = np.asarray(torch.as_tensor(weights).detach().cpu(), dtype=np.float64)
    if ax is None:
        _, ax = plt.subplots(figsize=(0.5 * values.shape[1] + 1.5, 0.5 * values.shape[0] + 1))
    ax.set_facecolor("white")
    largest = values.max() if values.size and values.max() > 0 else 1.0
    for (row, column), value in np.ndenumerate(values):
        side = np.sqrt(value / largest)
        colour = "tab:blue" if column < shared_columns else "tab:red"
        ax.add_patch(Rectangle((column - side / 2, row - side / 2), side, side, color=colour))
    ax.set_xlim(-0.5, values.shape[1] - 0.5)
    ax.set_ylim(values.shape[0] - 0.5, -0.5)
    ax.set_aspect("equal")
    ax.set_xticks(range(values.shape[1]),
                  column_labels or [f"λ{d + 1}" for d in range(values.shape[1])])
    ax.set_yticks(range(values.shape[0]),
                  row_labels or [f"task {t + 1}" for t in range(values.shape[0])])
    ax.set_title("ARD weights ω = 1/ℓ² of the top layer")
    return ax
