"""Plain text for people: numbers with a few significant digits and aligned tables (the command
line, the files' descriptions, the demo)."""

from __future__ import annotations

import math
from collections.abc import Sequence


def format_number(value: float, digits: int = 4) -> str:
    """A float with ``digits`` significant digits (``nan``/``inf`` spelled out)."""
    if math.isnan(value) or math.isinf(value):
        return str(value)
    return f"{value:.{digits}g}"


def count_of(number: int, noun: str) -> str:
    """``"1 module"``, ``"3 modules"``: a count with its noun, plural unless one."""
    return f"{number} {noun}{'' if number == 1 else 's'}"


def format_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Columns padded to their widest cell; numbers right-aligned, text left-aligned."""
    cells = [[_text(value) for value in row] for row in rows]
    numeric = [bool(rows) and all(_is_number(row[j]) for row in rows) for j in range(len(headers))]
    widths = [max([len(header), *(len(row[j]) for row in cells)])
              for j, header in enumerate(headers)]

    def line(values: Sequence[str]) -> str:
        padded = [value.rjust(width) if right else value.ljust(width)
                  for value, width, right in zip(values, widths, numeric, strict=True)]
        return "  ".join(padded).rstrip()

    rule = "  ".join("-" * width for width in widths)
    return "\n".join([line(headers), rule, *(line(row) for row in cells)])


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _text(value: object) -> str:
    if isinstance(value, float):
        return format_number(value)
    return str(value)
