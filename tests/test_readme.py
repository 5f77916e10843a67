"""The README says what the code does: its Python blocks run, its command lines parse, and every
number of its headline table is in the committed results file that row names."""

from __future__ import annotations

import json
import math
import re
import runpy
import shlex
from pathlib import Path

import pytest
from pyrogp_models.inference.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
RESULTS = ROOT / "benchmarks" / "results"
SUPERSCRIPTS = str.maketrans("⁰¹²³⁴⁵⁶⁷⁸⁹⁻", "0123456789-")
#: A number as the README writes it: 1.6, −0.889, 1000, 1e-3, 10⁶ (a power of ten).
NUMBER = re.compile(r"(?<![\w.])([−-]?\d+(?:\.\d+)?)(?:e(-?\d+)|([⁰¹²³⁴⁵⁶⁷⁸⁹⁻]+))?")


def blocks(language: str) -> list[str]:
    """The fenced blocks of ``language`` ('' for blocks without one)."""
    return [body for info, body in re.findall(r"^```(\w*)\n(.*?)^```", README, flags=re.S | re.M)
            if info == language]


def section(title: str) -> str:
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", README, flags=re.S | re.M)
    assert match, f"README has no section '{title}'"
    return match.group(1)


@pytest.mark.parametrize("index", range(len(blocks("python"))))
def test_every_python_block_runs(index, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    script = tmp_path / "block.py"
    script.write_text(blocks("python")[index])
    runpy.run_path(str(script), run_name="__main__")


def test_every_command_line_parses():
    parser = build_parser()
    lines = [line.split("#")[0] for block in blocks("") for line in block.splitlines()
             if line.startswith("pyrogp ")]
    assert lines, "no pyrogp command in the README"
    for line in lines:
        parser.parse_args(shlex.split(line)[1:])


def quoted_numbers(text: str) -> list[tuple[float, int]]:
    """(value, decimals shown) of every number in ``text``; powers of ten as 10⁶ read as 1e6."""
    out = []
    for digits, exponent, superscript in NUMBER.findall(text):
        digits = digits.replace("−", "-")
        if superscript:
            out.append((10.0 ** int(superscript.translate(SUPERSCRIPTS)), 0))
        elif exponent:
            out.append((float(f"{digits}e{exponent}"), -1))
        else:
            out.append((float(digits), len(digits.split(".")[1]) if "." in digits else 0))
    return out


def leaves(value) -> list[float]:
    """Every number in a parsed JSON document."""
    if isinstance(value, dict):
        return [x for item in value.values() for x in leaves(item)]
    if isinstance(value, list):
        return [x for item in value for x in leaves(item)]
    if isinstance(value, bool) or not isinstance(value, int | float):
        return []
    return [float(value)]


def found(number: float, decimals: int, values: list[float]) -> bool:
    if decimals < 0:  # written in scientific notation: the value itself
        return any(math.isclose(v, number, rel_tol=1e-9) for v in values)
    return any(round(v, decimals) == number for v in values if math.isfinite(v))


def headline_rows() -> list[list[str]]:
    rows = [[cell.strip() for cell in line.strip().strip("|").split("|")]
            for line in section("Headline numbers").splitlines() if line.startswith("|")]
    return [row for row in rows[2:] if len(row) == 3]


def test_the_headline_table_has_rows():
    assert len(headline_rows()) >= 5


@pytest.mark.parametrize("row", headline_rows(), ids=lambda row: row[0][:40])
def test_every_headline_number_is_in_its_results_file(row):
    claim, figure, source = row
    names = re.findall(r"`([\w.]+\.json)`", source)
    assert names, f"row names no results file: {source}"
    values = [x for name in names for x in leaves(json.loads((RESULTS / name).read_text()))]
    missing = [f"{number:g}" for number, decimals in quoted_numbers(claim + " " + figure)
               if not found(number, decimals, values)]
    assert not missing, f"{missing} are not in {names}"
