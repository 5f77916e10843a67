"""Shared test settings: float64 by default, Pyro's default (global) parameter store cleared
before every test, fixed seeds, one torch thread; a scratch-folder fixture for the modules that
ask for it."""

import pyro
import pytest
import torch

# helpers.py holds asserting helpers shared by several test modules: rewrite its asserts too.
pytest.register_assert_rewrite("helpers")

# The test problems are small: one thread avoids hand-off costs that dominate on a busy machine.
torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def float64_and_seed():
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    pyro.set_rng_seed(0)
    pyro.clear_param_store()
    yield
    torch.set_default_dtype(previous)


@pytest.fixture(params=[True, False], ids=["module-local params", "global param store"])
def param_mode(request):
    """Run a test under both of Pyro's parameter modes (the global store is Pyro's default)."""
    with pyro.settings.context(module_local_params=request.param):
        pyro.clear_param_store()
        yield request.param
    pyro.clear_param_store()


@pytest.fixture(autouse=True)
def one_torch_thread():
    """One intra-op torch thread in every test, also after a test that changed it (the CLI's
    --threads): the problems are tiny, and thread hand-offs on a busy machine cost more than the
    arithmetic."""
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def folder(request, tmp_path_factory):
    """A scratch folder shared by the tests of one module, named after the module."""
    return tmp_path_factory.mktemp(request.module.__name__.removeprefix("test_"))
