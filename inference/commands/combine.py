"""``pyrogp combine``: predictions of a module folder's experts combined by one rule.

The same output as ``pyrogp predict DIR --rule RULE``, with a rule by default
(:data:`~pyrogp_models.inference.commands.arguments.DEFAULT_RULE`).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from pyrogp_models.inference.commands import predict
from pyrogp_models.inference.commands.arguments import DEFAULT_RULE, add_rule_arguments

NAME = "combine"
HELP = "predict the rows of a data file by combining every module of a folder with one rule"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("modules", metavar="DIR", type=Path, help="a folder of modules (experts)")
    add_rule_arguments(parser, default=DEFAULT_RULE)
    parser.add_argument("--data", required=True, type=Path, help="CSV (with header) or .npz")
    predict.add_out(parser, "PRED")


def run(args: argparse.Namespace) -> int:
    from pyrogp_models.errors import DataError

    if not args.modules.is_dir():
        raise DataError(f"{args.modules} is not a module folder; combine needs a folder of "
                        "modules (use pyrogp predict for a single module file)")
    return predict.run(argparse.Namespace(**vars(args), rows_in_fit=False))
