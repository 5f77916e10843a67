"""The toy example of Boustati et al. (Sec. 1, Fig. 1): two tasks that mix a shared process g
and private processes h1, h2 non-linearly, on x ∈ [0, 1]:

    g(x) = −sin(8π(x + 1))/(2x + 1) − x⁴,   h1(x) = sin(3x),   h2(x) = 3x,
    f1(x) = cos²(g(x)) + h1(x),             f2(x) = sin(10x)·g(x)² + h2(x).

The paper gives no sizes; the spec's protocol (Sec. 2.1): N^t = 50 points per task at independent
U[0, 1] inputs, noise sd 0.05, optionally a gap in task 2, a 500-point test grid.

:func:`warped_tasks` are transfer toys unlike the paper's: one shared latent (periodic, or a sum of
three sinusoids) warped differently per task, task 2 with a gap where task 1 is observed.
"""

from __future__ import annotations

import numpy as np


def toy_functions(x: np.ndarray) -> np.ndarray:
    """f1 and f2 at x [N]: [2, N]."""
    g = -np.sin(8 * np.pi * (x + 1)) / (2 * x + 1) - x**4
    return np.stack([np.cos(g) ** 2 + np.sin(3 * x), np.sin(10 * x) * g**2 + 3 * x])


def toy_tasks(num_points: int = 50, noise: float = 0.05,
              gap: tuple[float, float] | None = None, seed: int = 0
              ) -> list[tuple[np.ndarray, np.ndarray]]:
    """Training pairs [(X^1 [N, 1], y^1 [N]), (X^2, y^2)] with independent inputs per task;
    task 2 has no points in ``gap`` (its N^2 is then smaller)."""
    rng = np.random.default_rng(seed)
    pairs = []
    for task in range(2):
        x = rng.uniform(0.0, 1.0, num_points)
        if gap is not None and task == 1:
            x = x[(x < gap[0]) | (x > gap[1])]
        y = toy_functions(x)[task] + noise * rng.standard_normal(len(x))
        pairs.append((x[:, None], y))
    return pairs


def toy_grid(num_points: int = 500) -> tuple[np.ndarray, np.ndarray]:
    """A test grid X [N, 1] on [0, 1] and the noiseless f1, f2 there [2, N]."""
    x = np.linspace(0.0, 1.0, num_points)
    return x[:, None], toy_functions(x)


#: The shared latents of the transfer toys (:func:`warped_functions`).
WARPED_LATENTS = ("periodic", "sines")


def warped_functions(x: np.ndarray, seed: int = 0, latent: str = "periodic") -> np.ndarray:
    """Two tasks that warp one shared latent g differently (transfer toys unlike the paper's),
    at x [N]: [2, N]. ``latent="periodic"``: g(x) = sin(2π(k x + φ)), k ∈ [1.5, 2.5],
    f1 = g + 0.4 g², f2 = 1.5 tanh(2g) − 0.5 g; ``"sines"``: g = Σ_{j≤3} a_j sin(2π(k_j x + φ_j))
    scaled to max |g| = 1 on [0, 1], k_j ∈ [0.5, 3], a_j ∈ [0.5, 1], f1 = g + 0.3 g³,
    f2 = 1 − 2 exp(−2g²) + 0.3 g. Every constant is seeded."""
    if latent == "periodic":
        rng = np.random.default_rng(1000 + seed)
        frequency, phase = rng.uniform(1.5, 2.5), rng.uniform(0.0, 1.0)
        g = np.sin(2 * np.pi * (frequency * x + phase))
        return np.stack([g + 0.4 * g**2, 1.5 * np.tanh(2 * g) - 0.5 * g])
    if latent != "sines":
        raise ValueError(f"unknown latent '{latent}'; choose from {list(WARPED_LATENTS)}")
    rng = np.random.default_rng(3000 + seed)
    frequency, phase = rng.uniform(0.5, 3.0, 3), rng.uniform(0.0, 1.0, 3)
    amplitude = rng.uniform(0.5, 1.0, 3)

    def sines(points: np.ndarray) -> np.ndarray:
        return (amplitude * np.sin(2 * np.pi * (np.multiply.outer(points, frequency) + phase))
                ).sum(-1)

    g = sines(x) / np.abs(sines(np.linspace(0.0, 1.0, 1001))).max()
    return np.stack([g + 0.3 * g**3, 1 - 2 * np.exp(-2 * g**2) + 0.3 * g])


def warped_gap(seed: int = 0, width: float = 0.2) -> tuple[float, float]:
    """The seeded gap of task 2 in :func:`warped_tasks`: ``width`` wide inside [0.15, 0.85]."""
    start = np.random.default_rng(2000 + seed).uniform(0.15, 0.85 - width)
    return float(start), float(start + width)


def warped_tasks(num_points: int = 60, noise: float = 0.05, seed: int = 0,
                 latent: str = "periodic") -> list[tuple[np.ndarray, np.ndarray]]:
    """Training pairs of :func:`warped_functions` at independent U[0, 1] inputs per task; task 2
    has no points in :func:`warped_gap`."""
    rng = np.random.default_rng(seed)
    gap = warped_gap(seed)
    pairs = []
    for task in range(2):
        x = rng.uniform(0.0, 1.0, num_points)
        if task == 1:
            x = x[(x < gap[0]) | (x > gap[1])]
        pairs.append((x[:, None], warped_functions(x, seed, latent)[task]
                      + noise * rng.standard_normal(len(x))))
    return pairs
