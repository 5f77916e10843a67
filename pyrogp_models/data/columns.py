"""What a model's inputs and output are called: the data columns it was fitted on.

Every fitted model — a module, a routed set, an expert combination, a distributed-kernel file —
carries one :class:`Columns` record: the feature names (one per input, in input order), the
target's name and the units of any of them (``{"co2": "ppm"}``). Each part is optional: a model
fitted on arrays has none. Files store the record under ``"columns"``; files written by version
0.1.0 kept ``features`` and ``target`` in their free-form ``info``, which :meth:`Columns.split_info`
reads.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Columns:
    """Feature names (one per input, in input order), the target name and units by column name
    (each optional; ``Columns()`` knows nothing)."""

    features: Sequence[str] | None = None  # a tuple once built
    target: str | None = None
    units: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self):
        if self.features is not None:
            if isinstance(self.features, str) or not all(
                    isinstance(name, str) and name for name in self.features):
                raise ValueError(f"features must be a sequence of non-empty names, got "
                                 f"{self.features!r}")
            if len(set(self.features)) != len(self.features):
                raise ValueError(f"features name a column twice: {', '.join(self.features)}")
            object.__setattr__(self, "features", tuple(self.features))
        if self.target is not None and not (isinstance(self.target, str) and self.target):
            raise ValueError(f"target must be a non-empty name, got {self.target!r}")
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in self.units.items()):
            raise ValueError(f"units must map column names to unit names, got {self.units!r}")
        object.__setattr__(self, "units", dict(self.units))

    def __hash__(self) -> int:
        return hash((self.features, self.target, tuple(sorted(self.units.items()))))

    def unit(self, column: str) -> str | None:
        """The unit of ``column``, if recorded."""
        return self.units.get(column)

    def describe(self) -> str:
        """One line, e.g. ``features: x, t [s]; target: y [m]`` (empty when nothing is known)."""
        def named(name: str) -> str:
            return f"{name} [{self.units[name]}]" if name in self.units else name

        parts = []
        if self.features is not None:
            parts.append(f"features: {', '.join(named(name) for name in self.features)}")
        if self.target is not None:
            parts.append(f"target: {named(self.target)}")
        return "; ".join(parts)

    def check_inputs(self, input_dim: int) -> None:
        """Raise ValueError unless the features (when known) name ``input_dim`` inputs."""
        if self.features is not None and len(self.features) != input_dim:
            raise ValueError(f"features {list(self.features)} do not name the {input_dim} "
                             "inputs")

    # The JSON record --------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The JSON record of a file (known parts only)."""
        record: dict[str, Any] = {}
        if self.features is not None:
            record["features"] = list(self.features)
        if self.target is not None:
            record["target"] = self.target
        if self.units:
            record["units"] = dict(self.units)
        return record

    @classmethod
    def from_dict(cls, record: Mapping[str, Any]) -> Columns:
        """The record :meth:`to_dict` wrote (ValueError or TypeError if it is malformed)."""
        unknown = set(record) - {"features", "target", "units"}
        if unknown:
            raise ValueError(f"unknown column fields {sorted(unknown)}")
        features = record.get("features")
        if features is not None and not isinstance(features, Sequence):
            raise TypeError(f"features must be a list of names, got {features!r}")
        return cls(features, record.get("target"), dict(record.get("units", {})))

    @classmethod
    def split_info(cls, record: Mapping[str, Any], info: Mapping[str, Any]
                   ) -> tuple[Columns, dict[str, Any]]:
        """The columns of a file's ``record`` and its ``info`` without them: the record's
        ``"columns"`` or, in a file written by version 0.1.0, ``features`` and ``target`` of
        ``info``."""
        info = dict(info)
        if "columns" in record:
            return cls.from_dict(record["columns"]), info
        return cls(info.pop("features", None), info.pop("target", None)), info
