"""The restart rule: a later start replaces the best only when it ends higher by more than the
margin, in the batched form (best_start) and the one-at-a-time form (replaces) alike."""

import itertools
import math

import torch
from pyrogp_models.inference.restarts import MARGIN, best_start, replaces


def test_replaces_picks_the_start_best_start_picks_from_a_pair():
    values = [-1e6, -250.0, -1.0, -0.5, 0.0, 0.5, 1.0, 250.0, 1e6, math.nan, -math.inf]
    near = [value * (1 + sign * MARGIN / 2) for value in (250.0, -250.0, 1e6)
            for sign in (-1, 1)]
    for best, bound in itertools.product(values + near, repeat=2):
        pair = torch.tensor([best, bound], dtype=torch.float64).nan_to_num(-math.inf)
        assert replaces(bound, best) == (int(best_start(pair)) == 1), (best, bound)


def test_a_start_within_the_margin_does_not_replace_and_nan_never_does():
    assert not replaces(100.0 * (1 + MARGIN / 2), 100.0)
    assert replaces(100.0 * (1 + 2 * MARGIN), 100.0)
    assert not replaces(math.nan, -1e9)
    assert replaces(-1e9, math.nan)
