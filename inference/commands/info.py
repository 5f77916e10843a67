"""``pyrogp info``: describe a module file, a folder of modules or a model file."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

NAME = "info"
HELP = "describe a module file, a module folder, a distributed-kernel or a multitask file"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path", metavar="DIR_OR_FILE", type=Path,
                        help="a module file, a folder of modules or a model file")
    parser.add_argument("--verbose", action="store_true",
                        help="list every module (default: a summary of a large set)")
    parser.add_argument("--json", action="store_true",
                        help="print the summary as JSON: of a module file or folder (every "
                             "module's size, kernel and Gaussian noise in data units, ELBO, "
                             "flags; the partition rule) or of a multitask file (model, tasks, "
                             "final ELBO, fit phases)")


def run(args: argparse.Namespace) -> int:
    from pyrogp_models import io

    if args.json:
        return _print_json(args.path)
    print(io.describe(args.path, args.verbose))
    return 0


def _print_json(path: Path) -> int:
    from pyrogp_models import io
    from pyrogp_models.errors import DataError
    from pyrogp_models.models.multitask.description import multitask_summary

    fmt = io.format_of(path)
    if fmt.name == "pyrogp-multitask":
        summary = multitask_summary(io.load(path))
    elif fmt.holds_modules:
        summary = io.load(path).summary()
    else:
        raise DataError("--json describes module files, module folders and multitask files; "
                        f"{path} is {fmt.noun}")
    print(json.dumps(summary, indent=1))
    return 0
