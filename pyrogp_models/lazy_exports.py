"""Public names of a package imported from their modules on first use (PEP 562), so that importing
the package — as the command line does — loads neither torch nor Pyro."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping


def lazy_exports(package: str, exports: Mapping[str, str]
                 ) -> tuple[list[str], Callable[[str], object], Callable[[], list[str]]]:
    """``__all__``, ``__getattr__`` and ``__dir__`` for ``package``, whose public names are
    defined in the modules ``exports`` maps them to; a name is imported when first read and then
    kept in the package's namespace."""

    def __getattr__(name: str):
        if name not in exports:
            raise AttributeError(f"module '{package}' has no attribute '{name}'")
        value = getattr(importlib.import_module(exports[name]), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *exports})

    return sorted(exports), __getattr__, __dir__
