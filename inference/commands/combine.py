"""``pyrogp combine``: predictions of a module folder's experts combined by one rule.

The same output as ``pyrogp predict DIR --rule RULE``; this command only makes the rule required.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from pyrogp_models.inference.commands import predict

from pyrogp_models.errors import DataError

NAME = "combine"
HELP = "predict the rows of a data file by combining every module of a folder with one rule"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("modules", metavar="DIR", type=Path, help="a folder of modules (experts)")
    parser.add_argument("--rule", required=True,
                        help="product-of-experts rule: poe, gpoe, bcm, rbcm, grbcm, barycenter "
                             "or barycenter-paper")
    parser.add_argument("--weights", help="expert weighting: uniform, entropy, softmax-var, ...")
    parser.add_argument("--temperature", type=float, help="softmax temperature of --weights")
    parser.add_argument("--data", required=True, type=Path, help="CSV (with header) or .npz")
    parser.add_argument("--out", required=True, type=Path, metavar="PRED",
                        help="output file, .csv or .npz (as written by pyrogp predict)")


def run(args: argparse.Namespace) -> int:
    if not args.modules.is_dir():
        raise DataError(f"{args.modules} is not a module folder; combine needs a folder of "
                        "modules (use pyrogp predict for a single module file)")
    return predict.run(args)
