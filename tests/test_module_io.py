"""Module files: bit-exact round trips, and every kind of damage is refused with the file named."""

import io
import json
import math
import os
import pickle
import struct
from dataclasses import replace

import numpy as np
import pytest
import torch
from pyrogp_models.inference.distributed_kernel_fit import (
    DistributedKernelSpec,
    fit_distributed_kernel,
)
from pyrogp_models.inference.local_fit import LocalFitSpec, fit_local, model_inputs
from pyrogp_models.inference.trainer import TrainConfig, train
from safetensors.torch import load as load_tensors
from safetensors.torch import save as save_tensors

from pyrogp_models.data.partitioners import partition_contiguous
from pyrogp_models.errors import ModuleFileError
from pyrogp_models.io import load_predictor
from pyrogp_models.models.distributed_kernel.files import save_distributed_kernel
from pyrogp_models.models.local.local_gps import LocalGPs
from pyrogp_models.modules import files as module_files
from pyrogp_models.modules.record import FORMAT_VERSION
from pyrogp_models.modules.signed import digest, signed_bytes


@pytest.fixture(scope="module")
def modules():
    rng = np.random.default_rng(0)
    X = rng.uniform(0, 3, size=(120, 2))
    y = np.sin(X[:, 0]) * np.cos(X[:, 1]) + 0.1 * rng.standard_normal(120)
    fit = fit_local((X, y, partition_contiguous(X, 3)), LocalFitSpec(num_inducing=5, ard=True),
                    TrainConfig(steps=30))
    return fit.modules


def same_module(a, b):
    tensors = ("inducing", "q_mean", "q_chol")
    kernel_a, kernel_b = a.kernel.named_values(), b.kernel.named_values()
    return (all(torch.equal(getattr(a, t), getattr(b, t)) for t in tensors)
            and kernel_a.keys() == kernel_b.keys()
            and all(torch.equal(kernel_a[k], kernel_b[k]) for k in kernel_a)
            and a.likelihood_params.keys() == b.likelihood_params.keys()
            and all(torch.equal(a.likelihood_params[k], b.likelihood_params[k])
                    for k in a.likelihood_params)
            and (a.kernel.tree(), a.likelihood_name, a.likelihood_options, a.num_data, a.elbo,
                 a.jitter, a.info) == (b.kernel.tree(), b.likelihood_name, b.likelihood_options,
                                       b.num_data, b.elbo, b.jitter, b.info)
            and a.standardisation.to_dict() == b.standardisation.to_dict())


def test_folder_round_trip_is_bit_exact(modules, tmp_path):
    module_files.save_modules(modules, tmp_path / "m", {"kind": "random", "num_partitions": 3})
    loaded = module_files.load_modules(tmp_path / "m")
    assert list(loaded) == list(modules)
    for name in modules:
        assert same_module(modules[name], loaded[name])
    assert module_files.read_index(tmp_path / "m")["partition"]["kind"] == "random"
    # Saving a loaded module again gives a file that loads to the same module.
    again = module_files.module_from_bytes(module_files.module_to_bytes(loaded["part000"]))
    assert same_module(again, modules["part000"])
    assert (tmp_path / "m" / "part000.safetensors").stat().st_size < 4096


def test_module_files_are_not_pickle_streams(modules, tmp_path):
    path = module_files.save_module(modules["part001"], tmp_path / "one")
    assert path.read_bytes()[:8] == struct.pack("<Q", len(path.read_bytes()) - 8 - sum(
        t.numel() * t.element_size() for t in load_tensors(path.read_bytes()).values()))
    assert b"\x80\x04" not in path.read_bytes()[:2]  # not a pickle stream


class Unpickled(AssertionError):
    pass


def trap_unpickling(monkeypatch):
    """Make every way to unpickle (pickle's functions and Unpickler, torch.load) raise."""
    def refuse(*args, **kwargs):
        raise Unpickled("something unpickled while loading")

    class RefusingUnpickler:
        def __init__(self, *args, **kwargs):
            refuse()

    for name in ("load", "loads"):
        monkeypatch.setattr(pickle, name, refuse)
    monkeypatch.setattr(pickle, "Unpickler", RefusingUnpickler)
    monkeypatch.setattr(torch, "load", refuse)
    monkeypatch.setattr(torch.serialization, "load", refuse)
    # the trap is armed: a torch checkpoint cannot be read
    with pytest.raises(Unpickled):
        torch.load(io.BytesIO())
    with pytest.raises(Unpickled):
        pickle.Unpickler(io.BytesIO()).load()


def test_loading_never_unpickles(modules, tmp_path, monkeypatch):
    """Module files, module folders, distributed-kernel files and training checkpoints load
    with every unpickling function trapped."""
    one = module_files.save_module(modules["part001"], tmp_path / "one")
    module_files.save_modules(modules, tmp_path / "folder", {"kind": "random",
                                                             "num_partitions": 3})
    X = np.linspace(0, 1, 30)[:, None]
    y = np.sin(6 * X[:, 0])
    spec = LocalFitSpec(num_inducing=4, collapsed=False)
    X_model, y_model, _ = model_inputs(X, y, spec)

    def model():
        return LocalGPs(X_model, y_model, partition_contiguous(X, 2), 4, "gaussian",
                        collapsed=False)

    checkpoint = tmp_path / "fit.safetensors"
    config = TrainConfig(steps=3, tol=None, checkpoint=checkpoint)
    train(model(), config=config)
    dk = fit_distributed_kernel((X, y), DistributedKernelSpec(2, 3), TrainConfig(steps=1))
    dk_path = save_distributed_kernel(dk.predictor, tmp_path / "dk.safetensors")

    with monkeypatch.context() as trap:
        trap_unpickling(trap)
        assert same_module(module_files.load_module(one), modules["part001"])
        loaded = module_files.load_modules(tmp_path / "folder")
        assert all(same_module(loaded[name], modules[name]) for name in modules)
        assert list(module_files.load_modules(tmp_path / "folder")) == list(modules)
        assert load_predictor(dk_path).num_data == 30
        resumed = train(model(), config=replace(config, steps=5, resume=True))
        assert resumed.steps == 5


@pytest.mark.parametrize("where", [0.02, 0.3, 0.6, 0.95])
def test_a_flipped_byte_anywhere_is_detected(modules, tmp_path, where):
    path = module_files.save_module(modules["part000"], tmp_path / "m")
    data = bytearray(path.read_bytes())
    position = int(where * (len(data) - 1))
    data[position] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(ModuleFileError, match=str(path.name)):
        module_files.load_module(path)


def test_truncated_and_missing_files(modules, tmp_path):
    path = module_files.save_module(modules["part000"], tmp_path / "m")
    data = path.read_bytes()
    for cut in (4, 20, len(data) // 2, len(data) - 1):
        path.write_bytes(data[:cut])
        with pytest.raises(ModuleFileError, match="m.safetensors"):
            module_files.load_module(path)
    with pytest.raises(ModuleFileError, match="no such module file"):
        module_files.load_module(tmp_path / "absent.safetensors")
    # a folder without an index is a set of module files: the broken one is named
    with pytest.raises(ModuleFileError, match="m.safetensors: not a readable module file"):
        module_files.load_modules(tmp_path)
    path.unlink()
    with pytest.raises(ModuleFileError, match="no module files"):
        module_files.load_modules(tmp_path)


def tampered(module, edit):
    """Rewrite a module file with edited tensors and a *valid* checksum (a careful forger)."""
    data = module_files.module_to_bytes(module)
    (size,) = struct.unpack("<Q", data[:8])
    metadata = json.loads(data[8:8 + size])["__metadata__"]
    tensors = load_tensors(data)
    edit(tensors)
    metadata["sha256"] = digest(metadata["pyrogp"], tensors)
    return save_tensors(tensors, metadata=metadata)


@pytest.mark.parametrize("edit,message", [
    (lambda t: t.update(q_mean=t["q_mean"][:, :-1].contiguous()), "q_mean has shape"),
    (lambda t: t.update(inducing=t["inducing"][:, :1].contiguous()), "shape"),
    (lambda t: t["q_chol"].__setitem__((0, 1, 1), math.nan), "NaN"),
    (lambda t: t["kernel.variance"].__setitem__(0, -1.0), "positive"),
    (lambda t: t["q_chol"].__setitem__((0, 0, 1), 0.5), "lower Cholesky"),
    (lambda t: t["q_chol"].__setitem__((0, 2, 2), 0.0), "lower Cholesky"),
])
def test_valid_checksum_but_invalid_content_is_refused(modules, tmp_path, edit, message):
    path = tmp_path / "forged.safetensors"
    path.write_bytes(tampered(modules["part002"], edit))
    with pytest.raises(ModuleFileError, match=message):
        module_files.load_module(path)


def test_newer_format_version_is_refused(modules, tmp_path, monkeypatch):
    with monkeypatch.context() as patch:
        patch.setattr(module_files, "MODULE_FILE", replace(module_files.MODULE_FILE,
                                                           version=FORMAT_VERSION + 1))
        path = module_files.save_module(modules["part000"], tmp_path / "m")
    with pytest.raises(ModuleFileError, match="newer"):
        module_files.load_module(path)


def earlier_format_bytes(module, version: int) -> bytes:
    """A module file as formats 1 and 2 wrote it: one stationary family with ``lengthscale``
    [L, D|1] and ``variance`` [L] (format 1 without ``prior_mean``)."""
    tensors = {"lengthscale": module.kernel.lengthscale, "variance": module.kernel.variance,
               "inducing": module.inducing, "q_mean": module.q_mean, "q_chol": module.q_chol,
               **{f"likelihood.{k}": v for k, v in module.likelihood_params.items()}}
    if version >= 2:
        tensors["prior_mean"] = module.prior_mean
    record = {"format": "pyrogp-module", "format_version": version,
              "kernel_family": module.kernel.kind, "likelihood_name": module.likelihood_name,
              "likelihood_options": module.likelihood_options, "num_data": module.num_data,
              "elbo": module.elbo, "standardisation": module.standardisation.to_dict(),
              "jitter": module.jitter, "info": module.info}
    return signed_bytes(record, {k: v.detach().contiguous() for k, v in tensors.items()})


@pytest.mark.parametrize("version", [1, 2])
def test_files_of_earlier_formats_load(modules, tmp_path, version):
    """Files written before kernels were trees (format 3) load and predict the same; format 1
    has no prior_mean (zero)."""
    module = modules["part000"]
    path = tmp_path / f"v{version}.safetensors"
    path.write_bytes(earlier_format_bytes(module, version))
    loaded = module_files.load_module(path)
    assert loaded.format_version == version and torch.equal(loaded.prior_mean, torch.zeros(1))
    assert loaded.kernel.tree() == module.kernel.tree()
    torch.testing.assert_close(loaded.predict_y(np.zeros((2, 2)))[0],
                               module.predict_y(np.zeros((2, 2)))[0], rtol=0, atol=0)


def test_a_crash_during_write_leaves_nothing_half_written(modules, tmp_path, monkeypatch):
    target = tmp_path / "m.safetensors"

    def crash(*args):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError):
        module_files.save_module(modules["part000"], target)
    assert list(tmp_path.iterdir()) == []


def test_a_fitted_module_gives_its_hyperparameters_as_plain_values():
    """``hyperparameters()`` is read by users (``float(value)``): no autograd graph behind it."""
    X = torch.linspace(0, 1, 30, dtype=torch.float64).unsqueeze(-1)
    fit = fit_local((X, torch.sin(6 * X[:, 0]), partition_contiguous(X, 2)),
                    LocalFitSpec(num_inducing=4), TrainConfig(steps=5, tol=None))
    for module in fit.modules.values():
        values = module.hyperparameters()
        assert {"lengthscale", "variance", "noise_variance"} <= set(values)
        assert not any(torch.is_tensor(v) and v.requires_grad for v in values.values())
