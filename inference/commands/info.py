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
                        help="a multitask file: print its summary (model, tasks, final ELBO, "
                             "fit phases) as JSON")


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

    if io.format_of(path).name != "pyrogp-multitask":
        raise DataError(f"--json describes multitask files; {path} is not one")
    print(json.dumps(multitask_summary(io.load(path)), indent=1))
    return 0
