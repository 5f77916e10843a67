"""The ``pyrogp`` command line: a thin argparse front end over the command modules.

Each command module exposes ``NAME``, ``HELP``, ``add_arguments(parser)`` and ``run(args) -> int``;
a new command is one more entry in :data:`COMMANDS`. Building the parser imports no heavy
library (a command imports torch and the models inside its ``run``), so ``pyrogp --help``,
``--version`` and ``pyrogp COMMAND --help`` answer at once. Errors caused by the input (bad data,
broken module files, missing files) print one line, ``pyrogp: error: <message>``, and exit with
code 2, as do errors in the arguments (an unknown option or choice, a missing argument);
``--debug`` shows the traceback instead. ``--threads N`` sets torch's intra-op thread
count before the command runs (on a small, shared machine one or two threads are often fastest).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from pyrogp_models.inference.commands.arguments import HelpFormatter
from pyrogp_models.inference.memory import keep_freed_memory

from pyrogp_models import __version__
from pyrogp_models.errors import PyrogpError

#: The command modules, in the order ``pyrogp --help`` lists them.
COMMANDS = [
    "pyrogp_models.inference.commands.fit_local",
    "pyrogp_models.inference.commands.recycle",
    "pyrogp_models.inference.commands.fit_distkernel",
    "pyrogp_models.inference.commands.fit_experts",
    "pyrogp_models.inference.commands.fit_multitask",
    "pyrogp_models.inference.commands.info",
    "pyrogp_models.inference.commands.predict",
    "pyrogp_models.inference.commands.combine",
    "pyrogp_models.inference.commands.evaluate",
]

#: Exceptions that describe bad input rather than a bug: reported in one line.
USER_ERRORS = (PyrogpError, OSError, ValueError, FloatingPointError)

_DEBUG_HELP = "show the full traceback of an error"
_THREADS_HELP = ("use N threads within torch operations (torch.set_num_threads); default: 1, "
                 "or torch's own choice when OMP_NUM_THREADS is set (the batched fits are many "
                 "small operations, which more threads slow down on a busy machine)")
_MAX_MESSAGE = 400


class _OneLineParser(argparse.ArgumentParser):
    """An argument parser whose errors (an unknown option, an invalid choice, a missing
    argument) are one line, ``pyrogp: error: <message> (see pyrogp COMMAND --help)``, with
    exit code 2, like the commands' own errors — not argparse's usage block."""

    def error(self, message: str):
        self.exit(2, f"pyrogp: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    """The ``pyrogp`` parser: global options and one subparser per module of :data:`COMMANDS`."""
    parser = _OneLineParser(
        prog="pyrogp", description="Gaussian processes fitted on partitions of data.")
    parser.add_argument("--version", action="version", version=f"pyrogp {__version__}")
    parser.add_argument("--debug", action="store_true", help=_DEBUG_HELP)
    parser.add_argument("--threads", metavar="N", type=_positive_int, help=_THREADS_HELP)
    subparsers = parser.add_subparsers(metavar="COMMAND", required=True,
                                       parser_class=_OneLineParser)
    for module_name in COMMANDS:
        command = importlib.import_module(module_name)
        subparser = subparsers.add_parser(command.NAME, help=command.HELP,
                                          description=command.HELP,
                                          formatter_class=HelpFormatter)
        # SUPPRESS keeps a global --debug or --threads from being reset by the subcommand's
        # default; both may also be given after the command name.
        subparser.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                               help=_DEBUG_HELP)
        subparser.add_argument("--threads", metavar="N", type=_positive_int,
                               default=argparse.SUPPRESS, help=_THREADS_HELP)
        command.add_arguments(subparser)
        subparser.set_defaults(run=command.run)
    return parser


def documented_parser() -> argparse.ArgumentParser:
    """:func:`build_parser` with the text of a command's ``epilog()`` (drawn from the library,
    so left out of the terminal's help) below its options: the documentation's command-line
    page is generated from it."""
    parser = build_parser()
    (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    for module_name in COMMANDS:
        command = importlib.import_module(module_name)
        if hasattr(command, "epilog"):
            action.choices[command.NAME].epilog = command.epilog()
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; returns the exit code."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_request:  # argparse has printed usage or help
        return int(exit_request.code or 0)
    try:
        _set_threads(args.threads)
        keep_freed_memory()
        return args.run(args)
    except USER_ERRORS as error:
        if args.debug:
            raise
        print(f"pyrogp: error: {_one_line(error)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("pyrogp: interrupted", file=sys.stderr)
        return 130


def _set_threads(threads: int | None) -> None:
    """torch's intra-op threads: ``threads``, else 1 unless OMP_NUM_THREADS is set."""
    if threads is None and "OMP_NUM_THREADS" in os.environ:
        return
    import torch

    torch.set_num_threads(threads or 1)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive whole number, got '{text}'")
    return value


def _one_line(error: BaseException) -> str:
    if isinstance(error, OSError) and error.filename is not None:
        message = f"{error.strerror or 'cannot access'}: {error.filename}"
    else:
        message = str(error) or type(error).__name__
    message = " ".join(message.split())
    return message if len(message) <= _MAX_MESSAGE else message[:_MAX_MESSAGE - 3] + "..."


if __name__ == "__main__":
    sys.exit(main())
