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
                             "flags; the partition rule), of a distributed-kernel file (regions, "
                             "kernel and likelihood in data units, ELBO) or of a multitask file "
                             "(model, tasks, final ELBO, fit phases)")


def run(args: argparse.Namespace) -> int:
    from pyrogp_models import io

    if args.json:
        print(json.dumps(io.summarise(args.path), indent=1))
    else:
        print(io.describe(args.path, args.verbose))
    return 0
