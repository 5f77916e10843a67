"""Signed safetensors files: the one container of every file the library writes.

A file is safetensors tensors plus, in the header's ``__metadata__``, a JSON record (``pyrogp``)
whose ``format`` says what the file is and a SHA-256 ``digest`` of the record and of every tensor's
name, dtype, shape and bytes, so a flipped byte anywhere is detected. Module files
(:mod:`pyrogp_models.modules.files`), distributed-kernel files and multitask files differ only in
their record and tensors: each is a :class:`SignedFormat`, which writes, reads and checks the
container, and a function that builds the object from a checked record (the registry of what
each format is for lives in :mod:`pyrogp_models.io`). Nothing here unpickles; writes are atomic
(temporary file + rename).
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load as load_safetensors
from safetensors.torch import save as save_safetensors

from pyrogp_models.errors import ModuleFileError

#: What each file format of the library is, for messages when one is opened as another.
FORMAT_NAMES = {"pyrogp-module": "a module file",
                "pyrogp-distkernel": "a distributed-kernel file",
                "pyrogp-multitask": "a multitask model file"}
#: safetensors refuses headers above 100 MB; anything larger is not one of ours.
_MAX_HEADER = 100_000_000

#: Makes the error of a broken file from the reason: ``fail(reason) -> ModuleFileError``.
Fail = Callable[[str], ModuleFileError]


@dataclass(frozen=True)
class SignedFormat:
    """One kind of signed file: its ``name`` (the record's ``format``, a key of
    :data:`FORMAT_NAMES`) and the newest ``version`` this library reads and writes.

    Writing adds the format and version to a record; reading checks the container (digest,
    format, version) and hands the record and tensors to a ``build(record, tensors, fail)``
    function, turning any malformed field (a missing key, a wrong type or value) into one
    :class:`ModuleFileError` line that names the file."""

    name: str
    version: int

    @property
    def noun(self) -> str:
        """What the file is, for messages: ``a module file``, ..."""
        return FORMAT_NAMES[self.name]

    def to_bytes(self, record: dict[str, Any], tensors: dict[str, torch.Tensor]) -> bytes:
        """The bytes of a file holding ``record`` (format and version added) and ``tensors``."""
        return signed_bytes({**record, "format": self.name, "format_version": self.version},
                            tensors)

    def save(self, path: str | Path, record: dict[str, Any],
             tensors: dict[str, torch.Tensor]) -> Path:
        """Write one file atomically; returns its path."""
        path = Path(path)
        atomic_write(path, self.to_bytes(record, tensors))
        return path

    def from_bytes(self, data: bytes, build: Callable[[dict, dict, Fail], Any],
                   source: str = "<bytes>") -> Any:
        """Check the bytes of a file and build its object; ``source`` names it in errors."""

        def fail(reason: str) -> ModuleFileError:
            return ModuleFileError(f"{source}: {' '.join(reason.split())}")

        record, tensors = read_signed(data, fail, self.name, self.version)
        try:
            return build(record, tensors, fail)
        except (KeyError, TypeError, ValueError, IndexError) as error:
            raise fail(f"invalid record ({type(error).__name__}: {error})") from None

    def load(self, path: str | Path, build: Callable[[dict, dict, Fail], Any]) -> Any:
        """Read, check and build the file at ``path``."""
        path = Path(path)
        if not path.is_file():
            raise ModuleFileError(f"{path}: no such {self.noun.removeprefix('a ')}")
        return self.from_bytes(path.read_bytes(), build, str(path))

    def holds(self, path: str | Path) -> bool:
        """Whether ``path`` is a file whose header names this format (reads the header only)."""
        return file_format(path) == self.name


def digest(record_json: str, tensors: dict[str, torch.Tensor]) -> str:
    """SHA-256 of the record's JSON text and of every tensor (name, dtype, shape, bytes), in
    name order."""
    sha = hashlib.sha256(record_json.encode())
    for name in sorted(tensors):
        tensor = tensors[name].detach().cpu().contiguous()
        sha.update(f"{name}|{tensor.dtype}|{list(tensor.shape)}".encode())
        sha.update(tensor.numpy().tobytes())
    return sha.hexdigest()


def signed_bytes(record: dict[str, Any], tensors: dict[str, torch.Tensor]) -> bytes:
    """The bytes of a file holding ``tensors`` (moved to the CPU) and the signed ``record``."""
    tensors = {name: value.detach().cpu().contiguous() for name, value in tensors.items()}
    record_json = json.dumps(record, sort_keys=True)
    return save_safetensors(tensors, metadata={"pyrogp": record_json,
                                               "sha256": digest(record_json, tensors)})


def read_signed(data: bytes, fail: Callable[[str], Exception], expected: str, version: int
                ) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """The record and tensors of a file of format ``expected``, its digest checked and its
    format version at most ``version``; ``fail(reason)`` makes the error raised."""
    try:
        (header_size,) = struct.unpack("<Q", data[:8])
        metadata = json.loads(data[8:8 + header_size])["__metadata__"]
        tensors = load_safetensors(data)
        record_json = metadata["pyrogp"]
        record = json.loads(record_json)
        found_digest = digest(record_json, tensors)
    except Exception as error:  # noqa: BLE001 — any parse failure means a broken file
        kind = FORMAT_NAMES[expected].removeprefix("a ")
        raise fail(f"not a readable {kind} ({type(error).__name__})") from None
    found = record.get("format") if isinstance(record, dict) else None
    if found != expected:
        raise fail(f"{FORMAT_NAMES[found]}, not {FORMAT_NAMES[expected]}" if found in FORMAT_NAMES
                   else f"not {FORMAT_NAMES[expected]} of pyrogp")
    if found_digest != metadata.get("sha256"):
        raise fail("checksum mismatch: the file was corrupted or modified")
    found_version = record.get("format_version")
    if not isinstance(found_version, int) or found_version > version:
        raise fail(f"format version {found_version} is newer than this library's {version}")
    return record, tensors


def file_format(path: str | Path) -> str | None:
    """The ``format`` a pyrogp file names in its header (None for anything else); reads the
    header only."""
    path = Path(path)
    if not path.is_file():
        return None
    try:
        with path.open("rb") as handle:
            (size,) = struct.unpack("<Q", handle.read(8))
            if size > _MAX_HEADER:
                return None
            record = json.loads(json.loads(handle.read(size))["__metadata__"]["pyrogp"])
        return record.get("format")
    except Exception:  # noqa: BLE001 — unreadable means "not ours"; the loaders explain why
        return None


def atomic_write(path: Path, data: bytes, durable: bool = True) -> None:
    """Write bytes to a temporary sibling and rename it over ``path``; ``durable``: flushed to
    the disk before the rename (writers of many files pass False and call :func:`sync_to_disk`
    once)."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as handle:
            handle.write(data)
            if durable:
                handle.flush()
                os.fsync(handle.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def sync_to_disk() -> None:
    """Flush every file written so far to the disk: one sync for a folder of files instead of
    one per file (5000 module files: about 20 s of fsync calls on a plain disk)."""
    if hasattr(os, "sync"):
        os.sync()
