"""``pyrogp info``: describe a module file, a folder of modules or a model file."""

from __future__ import annotations

import argparse
from pathlib import Path

NAME = "info"
HELP = "describe a module file, a module folder, a distributed-kernel or a multitask file"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path", metavar="DIR_OR_FILE", type=Path,
                        help="a module file, a folder of modules or a model file")
    parser.add_argument("--verbose", action="store_true",
                        help="list every module (default: a summary of a large set)")


def run(args: argparse.Namespace) -> int:
    from pyrogp_models import io

    print(io.describe(args.path, args.verbose))
    return 0
