"""Module files: safetensors for the tensors, JSON for the rest; loading never unpickles.

One module is one signed ``.safetensors`` file (:mod:`pyrogp_models.modules.signed`): its
record holds the kernel's tree (:meth:`~pyrogp_models.kernels.base.Kernel.tree`; its values are
tensors ``kernel.…``), likelihood, standardisation, N, ELBO, format version, ..., and a
SHA-256 digest covers the record and every tensor, so a flipped byte anywhere is detected. A
folder of modules has an index, ``modules.json``, naming the module files and the rule that
partitioned the data (so new points can be routed to the module of their partition), with a
SHA-256 digest of its own content; it may name only plain file names inside the folder. A
folder of module files collected from several sites without an index is read as a set of
modules (recycling and combining need no index; routing does).

Writes are atomic (temporary file + rename); module files reach the disk before the index is
written, so a crash never leaves an index naming a half-written module.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from pathlib import Path

import torch

from pyrogp_models.data import Standardisation
from pyrogp_models.data.columns import Columns
from pyrogp_models.data.partitioners import Partition
from pyrogp_models.errors import CholeskyError, ModuleFileError
from pyrogp_models.kernels import (
    PROFILES,
    Kernel,
    describable,
    held,
    kernel_from_tree,
    stationary_kernel,
)
from pyrogp_models.likelihoods import LIKELIHOODS
from pyrogp_models.modules.record import FORMAT_VERSION, Module
from pyrogp_models.modules.signed import Fail, SignedFormat, atomic_write, sync_to_disk

#: One module per file.
MODULE_FILE = SignedFormat("pyrogp-module", FORMAT_VERSION)
INDEX_NAME = "modules.json"
SUFFIX = ".safetensors"
_TENSOR_FIELDS = ("inducing", "q_mean", "q_chol", "prior_mean")
_NAME_PATTERN = re.compile(r"^[A-Za-z0-9_.\-]+$")


# Single modules ---------------------------------------------------------------------------------
def module_to_bytes(module: Module) -> bytes:
    """Serialise a (validated) module to the bytes of a safetensors file."""
    source = f"module '{module.info.get('name', '?')}'"
    if not describable(module.kernel):
        raise ModuleFileError(
            f"{source}: its kernel ({type(module.kernel).__name__}) cannot be saved: a module "
            "file holds only kernels of pyrogp_models.kernels (RBF, Matern*, RationalQuadratic, "
            "Periodic, Linear, Constant, White, with + and *); build the kernel from those to "
            "make the module saveable")
    validate_module(module, source)
    tensors = {name: getattr(module, name) for name in _TENSOR_FIELDS}
    tensors.update({name: value.detach() for name, value in module.kernel.named_values().items()})
    tensors.update({f"likelihood.{k}": v for k, v in module.likelihood_params.items()})
    record = {
        "kernel": module.kernel.tree(),
        "likelihood_name": module.likelihood_name,
        "likelihood_options": module.likelihood_options,
        "num_data": int(module.num_data),
        "elbo": float(module.elbo),
        "standardisation": module.standardisation.to_dict(),
        "jitter": float(module.jitter),
        "columns": module.columns.to_dict(),
        "info": module.info,
    }
    return MODULE_FILE.to_bytes(record, tensors)


def save_module(module: Module, path: str | Path) -> Path:
    """Write one module file atomically; returns its path."""
    path = Path(path)
    if path.suffix != SUFFIX:
        path = path.with_name(path.name + SUFFIX)
    atomic_write(path, module_to_bytes(module))
    return path


def load_module(path: str | Path) -> Module:
    """Read and validate one module file; any problem raises :class:`ModuleFileError`."""
    return MODULE_FILE.load(path, _build_module)


def module_from_bytes(data: bytes, source: str = "<bytes>") -> Module:
    """Parse and validate the bytes of a module file."""
    return MODULE_FILE.from_bytes(data, _build_module, source)


def _build_module(record: dict, tensors: dict[str, torch.Tensor], fail: Fail) -> Module:
    """The module of a checked file record (version 1: no prior mean; before ``columns``: the
    feature and target names in ``info``)."""
    version = record["format_version"]
    try:
        columns, info = Columns.split_info(record, record["info"])
        module = Module(
            kernel=_stored_kernel(record, tensors, version, fail),
            likelihood_name=record["likelihood_name"],
            likelihood_options=record["likelihood_options"],
            likelihood_params={k.split(".", 1)[1]: v for k, v in tensors.items()
                               if k.startswith("likelihood.")},
            inducing=tensors["inducing"], q_mean=tensors["q_mean"], q_chol=tensors["q_chol"],
            num_data=record["num_data"], elbo=record["elbo"],
            standardisation=Standardisation.from_dict(record["standardisation"]),
            jitter=record["jitter"], info=info, format_version=version,
            prior_mean=tensors["prior_mean"] if version >= 2 else None, columns=columns)
    except KeyError as error:
        raise fail(f"missing field {error}") from None
    _check_module(module, fail)
    return module


def _stored_kernel(record: dict, tensors: dict, version: int, fail) -> Kernel:
    """The kernel of a file: a tree (format 3) or one stationary family with ``lengthscale``
    [L, D|1] and ``variance`` [L] (formats 1 and 2)."""
    if version >= 3:
        try:
            return held(kernel_from_tree(record["kernel"], tensors, batch_dims=1))
        except ModuleFileError as error:
            raise fail(str(error)) from None
    family, lengthscale = record["kernel_family"], tensors["lengthscale"]
    if family not in PROFILES:
        raise fail(f"unknown kernel family '{family}'")
    if lengthscale.dim() != 2 or tensors["variance"].shape != lengthscale.shape[:1]:
        raise fail(f"lengthscale {list(lengthscale.shape)} and variance "
                   f"{list(tensors['variance'].shape)} do not fit one kernel per latent")
    return stationary_kernel(family, lengthscale, tensors["variance"],
                             tensors["inducing"].shape[-1])


def validate_module(module: Module, source: str = "module") -> None:
    """Shapes agree, values are finite, scales are positive and covariances positive definite;
    any problem raises :class:`ModuleFileError` naming ``source``."""
    _check_module(module, lambda reason: ModuleFileError(f"{source}: {reason}"))


def _check_module(module: Module, fail: Fail) -> None:
    """:func:`validate_module` with the error made by ``fail(reason)``."""
    if module.likelihood_name not in LIKELIHOODS:
        raise fail(f"unknown likelihood '{module.likelihood_name}'")
    if module.inducing.dim() != 2:
        raise fail(f"inducing inputs must be [M, D], got {list(module.inducing.shape)}")
    M, D = module.inducing.shape
    L = module.q_mean.shape[0] if module.q_mean.dim() == 2 else -1
    expected = {"q_mean": (L, M), "q_chol": (L, M, M), "prior_mean": (L,)}
    for name, shape in expected.items():
        if tuple(getattr(module, name).shape) != shape:
            raise fail(f"{name} has shape {list(getattr(module, name).shape)}, "
                       f"expected {list(shape)}")
    if tuple(module.kernel.batch_shape) != (L,):
        raise fail(f"the kernel has batch shape {list(module.kernel.batch_shape)}, expected "
                   f"[{L}] (one per latent function)")
    if max(max(leaf.active_dims) for _, leaf in module.kernel.parts()) >= D:
        raise fail(f"inducing inputs of shape {[M, D]} have fewer columns than the kernel reads")
    if len(module.standardisation.x_mean) != D or len(module.standardisation.x_scale) != D:
        raise fail("standardisation does not match the input dimension")
    tensors = {name: getattr(module, name) for name in _TENSOR_FIELDS}
    tensors.update(module.likelihood_params)
    tensors.update(module.kernel.named_values())
    for name, tensor in tensors.items():
        if not bool(torch.isfinite(tensor).all()):
            raise fail(f"{name} contains NaN or inf")
    positives = [*module.likelihood_params.values()] + [
        getattr(leaf, h.name) for _, leaf in module.kernel.parts()
        for h in getattr(leaf, "hyperparameters", ()) if h.positive]
    if not all(bool((t > 0).all()) for t in positives):
        raise fail("kernel or likelihood parameters must be positive")
    try:
        module.columns.check_inputs(D)
    except ValueError as error:
        raise fail(str(error)) from None
    if not (math.isfinite(module.jitter) and module.jitter >= 0):
        raise fail("jitter must be a finite non-negative number")
    diagonal = module.q_chol.diagonal(dim1=-2, dim2=-1)
    upper = module.q_chol.triu(1)
    if not bool((diagonal > 0).all()) or bool((upper != 0).any()):
        raise fail("q_chol is not a lower Cholesky factor with a positive diagonal")
    try:
        module.prior_cholesky()
    except CholeskyError:
        raise fail("the prior covariance K_zz is not positive definite") from None


# Folders of modules -----------------------------------------------------------------------------
def save_modules(modules: dict[str, Module], folder: str | Path,
                 partition: Partition | dict | None = None) -> Path:
    """Write a dictionary of modules and its index into ``folder`` (created if needed).

    ``partition`` (a :class:`Partition` or its JSON rule) is the rule that split the data, in
    module order, so predictions can route new points. Everything is checked before anything is
    written.
    """
    folder = Path(folder)
    for name in modules:
        if not _NAME_PATTERN.match(name):
            raise ValueError(f"module name '{name}' may only use letters, digits, '.', '_', '-'")
    rule = partition.rule if isinstance(partition, Partition) else partition
    record = {"format": "pyrogp-modules", "format_version": FORMAT_VERSION,
              "modules": {name: f"{name}{SUFFIX}" for name in modules}, "partition": rule}
    index = json.dumps({**record, "sha256": _index_digest(record)}, indent=1).encode()
    contents = {name: module_to_bytes(module) for name, module in modules.items()}
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in contents.items():
        atomic_write(folder / record["modules"][name], data, durable=False)
    sync_to_disk()  # every module file is on the disk before the index names it
    atomic_write(folder / INDEX_NAME, index)
    return folder


def _index_digest(record: dict) -> str:
    """SHA-256 of an index's canonical JSON (without its own digest)."""
    return hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()


def read_index(folder: str | Path) -> dict:
    """The index of a module folder, checked: its digest, and that every module file it names
    is a plain file name inside the folder (no separators, no ``..``, no link leading out)."""
    folder = Path(folder)
    path = folder / INDEX_NAME
    if not path.is_file():
        raise ModuleFileError(f"{folder}: not a module folder (no {INDEX_NAME})")
    try:
        index = json.loads(path.read_text())
        if index.get("format") != "pyrogp-modules" or not isinstance(index["modules"], dict):
            raise ValueError
    except Exception:  # noqa: BLE001
        raise ModuleFileError(f"{path}: not a readable module index") from None
    record = {key: value for key, value in index.items() if key != "sha256"}
    if index.get("sha256") != _index_digest(record):
        raise ModuleFileError(f"{path}: checksum mismatch: the index was corrupted or modified")
    for name, file in index["modules"].items():
        if not (isinstance(name, str) and isinstance(file, str) and _plain_file(folder, file)):
            raise ModuleFileError(f"{path}: module '{name}' names the file {file!r}, which is "
                                  "not a plain file name inside the folder")
    return index


def _plain_file(folder: Path, file: str) -> bool:
    """A file name without separators or ``..`` whose real path stays inside ``folder``."""
    if not _NAME_PATTERN.match(file) or file in (".", "..") or not file.endswith(SUFFIX):
        return False
    target = folder / file
    return not target.exists() or target.resolve().parent == folder.resolve()


def module_files(path: str | Path) -> dict[str, Path]:
    """The module files of a folder by module name: those its index names, in index order, or —
    in a folder of module files collected without an index — every ``*.safetensors`` file, by
    name; for a module file, itself."""
    path = resolve_path(path)
    if not path.is_dir():
        return {path.name.removesuffix(SUFFIX): path}
    if (path / INDEX_NAME).exists():
        return {name: path / file for name, file in read_index(path)["modules"].items()}
    files = sorted(file for file in path.glob(f"*{SUFFIX}") if file.is_file())
    if not files:
        raise ModuleFileError(f"{path}: no module files (*{SUFFIX}) and no {INDEX_NAME}")
    return {file.name.removesuffix(SUFFIX): file for file in files}


def load_modules(folder: str | Path) -> dict[str, Module]:
    """Every module of a folder (:func:`module_files`), validated."""
    return {name: load_module(file) for name, file in module_files(folder).items()}


def partition_rule(path: str | Path) -> dict | None:
    """The partition rule stored with a module folder (None for a file or a folder without an
    index)."""
    path = Path(path)
    if path.is_dir() and (path / INDEX_NAME).exists():
        return read_index(path).get("partition")
    return None


def resolve_path(path: str | Path) -> Path:
    """The module file or folder a user means by ``path``: as written, or with ``.safetensors``
    appended when only that exists."""
    path = Path(path)
    if path.exists():
        return path
    with_suffix = path.with_name(path.name + SUFFIX)
    if not path.name.endswith(SUFFIX) and with_suffix.is_file():
        return with_suffix
    raise ModuleFileError(f"{path}: no such module file or folder")
