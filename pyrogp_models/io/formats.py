"""The registry of file formats: what kind of file a path is, and what to do with each kind.

Every file or folder the library writes is one of :data:`FORMATS`, told apart by the format its
header names (:func:`~pyrogp_models.modules.signed.file_format`; a folder is a module folder).
Each :class:`FileFormat` maps its kind to five functions — ``load`` (path → object), ``save``
(object, path → path), ``as_predictor`` (object → a data-units
:class:`~pyrogp_models.modules.predictor.Predictor`), ``describe`` (object → text) and
``summarise`` (object → JSON-able values) — so a caller decides nothing by itself::

    describe("fit/modules")                 # the text `pyrogp info` prints
    load_predictor("meta.safetensors")      # a module, routed modules, or a model file
    load("model.safetensors")               # the file's own object
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyrogp_models.errors import ModuleFileError
from pyrogp_models.io.module_sets import ModuleSet, load_module_set
from pyrogp_models.models.distributed_kernel.files import (
    DistributedKernelPredictor,
    load_distributed_kernel,
    save_distributed_kernel,
)
from pyrogp_models.models.multitask.description import describe_multitask, multitask_summary
from pyrogp_models.models.multitask.files import load_multitask, save_multitask
from pyrogp_models.modules.files import resolve_path, save_module, save_modules
from pyrogp_models.modules.predictor import Predictor
from pyrogp_models.modules.signed import FORMAT_NAMES, file_format

#: The format of a module folder (its index, ``modules.json``, or module files without one).
MODULE_FOLDER = "pyrogp-modules"


@dataclass(frozen=True)
class FileFormat:
    """One kind of file: its ``name`` (the ``format`` its header names), what it is called in
    messages (``noun``), whether it holds modules (which products of experts combine and a
    meta-GP recycles), and its five functions."""

    name: str
    noun: str
    holds_modules: bool
    #: path → the object the file holds
    load: Callable[[Path], Any]
    #: (object, path) → the path written
    save: Callable[[Any, Path], Path]
    #: object → its data-units predictor
    as_predictor: Callable[[Any], Predictor]
    #: (object, verbose) → a few lines of text (verbose: every module of a large set)
    describe: Callable[[Any, bool], str]
    #: object → JSON-able values (``pyrogp info --json``)
    summarise: Callable[[Any], dict[str, Any]]


#: Every format the library writes, by name.
FORMATS: dict[str, FileFormat] = {fmt.name: fmt for fmt in (
    FileFormat("pyrogp-module", FORMAT_NAMES["pyrogp-module"], True, load_module_set,
               lambda modules, path: save_module(modules.first, path), ModuleSet.predictor,
               ModuleSet.describe, ModuleSet.summary),
    FileFormat(MODULE_FOLDER, "a module folder", True, load_module_set,
               lambda modules, path: save_modules(modules.modules, path, modules.rule),
               ModuleSet.predictor, ModuleSet.describe, ModuleSet.summary),
    FileFormat("pyrogp-distkernel", FORMAT_NAMES["pyrogp-distkernel"], False,
               load_distributed_kernel, save_distributed_kernel, lambda predictor: predictor,
               lambda predictor, verbose: DistributedKernelPredictor.describe(predictor),
               DistributedKernelPredictor.summary),
    FileFormat("pyrogp-multitask", FORMAT_NAMES["pyrogp-multitask"], False, load_multitask,
               save_multitask, lambda predictor: predictor,
               lambda predictor, verbose: describe_multitask(predictor), multitask_summary),
)}


def format_of(path: str | Path) -> FileFormat:
    """The format of the file or folder at ``path`` (as typed: ``.safetensors`` may be left
    off): a folder is a module folder, a file what its header names; a file whose header names
    no format is taken for a module file, whose loader then says what is wrong with it."""
    path = resolve_path(path)
    if path.is_dir():
        return FORMATS[MODULE_FOLDER]
    return FORMATS.get(file_format(path) or "", FORMATS["pyrogp-module"])


def load(path: str | Path) -> Any:
    """The object in the file or folder at ``path``: a
    :class:`~pyrogp_models.io.module_sets.ModuleSet` for a module file or folder, the
    predictor of a distributed-kernel or multitask file."""
    path = resolve_path(path)
    return format_of(path).load(path)


def save(value: Any, path: str | Path, format_name: str) -> Path:
    """Write ``value`` (an object :func:`load` returns) as a file or folder of the format
    ``format_name``; returns the path written."""
    return FORMATS[format_name].save(value, Path(path))


def load_predictor(path: str | Path) -> Predictor:
    """The data-units predictor of any file or folder the library writes: a module, a module
    folder routed by its stored partition rule, a distributed-kernel or a multitask file."""
    path = resolve_path(path)
    fmt = format_of(path)
    return fmt.as_predictor(fmt.load(path))


def load_modules(path: str | Path) -> ModuleSet:
    """The :class:`~pyrogp_models.io.module_sets.ModuleSet` of a module file or folder; a
    model file (which holds no modules) raises :class:`ModuleFileError`."""
    path = resolve_path(path)
    fmt = format_of(path)
    if not fmt.holds_modules:
        raise ModuleFileError(f"{path}: {fmt.noun}, not a module file or folder")
    return fmt.load(path)


def describe(path: str | Path, verbose: bool = False) -> str:
    """A few lines about the file or folder at ``path`` (what ``pyrogp info`` prints)."""
    path = resolve_path(path)
    fmt = format_of(path)
    return fmt.describe(fmt.load(path), verbose)


def summarise(path: str | Path) -> dict[str, Any]:
    """The file or folder at ``path`` as JSON-able values (what ``pyrogp info --json`` prints)."""
    path = resolve_path(path)
    fmt = format_of(path)
    return fmt.summarise(fmt.load(path))
