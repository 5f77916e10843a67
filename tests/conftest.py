"""Shared test settings: float64 by default, module-local Pyro parameters, fixed seeds."""

import pyro
import pytest
import torch

pyro.settings.set(module_local_params=True)
# The test problems are small: one thread avoids hand-off costs that dominate on a busy machine.
torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def float64_and_seed():
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    pyro.set_rng_seed(0)
    yield
    torch.set_default_dtype(previous)
