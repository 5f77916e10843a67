"""The ``--kernel EXPR`` option of the fitting commands and ``recycle``: one help text, read by
:func:`~pyrogp_models.kernels.expression.parse_kernel` once the data's columns are known (an
error in the expression is a one-line error naming the token, before any fitting)."""

from __future__ import annotations

import argparse

from pyrogp_models.kernels import KINDS

KERNEL_HELP = (
    "the kernel, an expression: " + ", ".join(sorted(KINDS)) + " joined by + and *, with "
    "parentheses and optional values in data units, e.g. \"rbf + periodic(period=1) * rbf + "
    "rq + white\"; fixed(v) holds a value, ard gives one lengthscale per input column, "
    "dims=[0,2] selects input columns")


def add_kernel_argument(parser: argparse.ArgumentParser, default: str | None = "rbf",
                        default_text: str = "rbf") -> None:
    """``--kernel EXPR`` with :data:`KERNEL_HELP` and its default."""
    parser.add_argument("--kernel", metavar="EXPR", default=default,
                        help=f"{KERNEL_HELP} (default: {default_text})")
