"""How fast the command line answers before it does any work: ``pyrogp --help``, ``--version``
and every ``pyrogp COMMAND --help``, each a fresh process of the installed ``pyrogp`` script.

Target: ``pyrogp --help`` in under a second (median of 5 runs). For scale, the same table times
``python -c "import torch"`` — what every command paid at start before the command line imported
the libraries only inside a command's run. Runs are interleaved (one of each per round), so a
change of the machine's load touches every row alike; the JSON records the load.

Run ``python benchmarks/cli_startup.py`` (``--quick``: ``--help``, ``--version`` and the torch
import only). Writes ``benchmarks/results/cli_startup.json``.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import benchmark_parser, machine_info, output_path, print_table, write_json  # noqa: E402

ROUNDS = 5
TARGET_SECONDS = 1.0
COMMANDS = ("fit-local", "recycle", "fit-distkernel", "fit-experts", "fit-multitask", "info",
            "predict", "combine", "evaluate")


def pyrogp_script() -> str:
    """The installed ``pyrogp`` entry point beside this interpreter."""
    script = Path(sys.executable).with_name("pyrogp")
    if not script.exists():
        raise SystemExit(f"no pyrogp script beside {sys.executable}; install the package")
    return str(script)


def seconds(argv: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, check=True, capture_output=True)
    return time.perf_counter() - start


def main() -> None:
    args = benchmark_parser(__doc__.splitlines()[0], "cli_startup", threads=False).parse_args()
    pyrogp = pyrogp_script()
    cases = {"pyrogp --help": [pyrogp, "--help"], "pyrogp --version": [pyrogp, "--version"]}
    if not args.quick:
        cases.update({f"pyrogp {name} --help": [pyrogp, name, "--help"] for name in COMMANDS})
    cases['python -c "import torch"'] = [sys.executable, "-c", "import torch"]
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(ROUNDS):
        for name, argv in cases.items():
            times[name].append(seconds(argv))
    medians = {name: statistics.median(values) for name, values in times.items()}
    rows = [(name, f"{medians[name]:.3f}", f"{min(values):.3f}", f"{max(values):.3f}")
            for name, values in times.items()]
    print_table(rows, ["command", "median s", "min s", "max s"],
                title=f"Command-line startup, {ROUNDS} interleaved rounds")
    met = medians["pyrogp --help"] < TARGET_SECONDS
    print(f"pyrogp --help: median {medians['pyrogp --help']:.3f} s "
          f"({'meets' if met else 'misses'} the {TARGET_SECONDS:g} s target)")
    out = output_path(args, "cli_startup")
    payload = {
        "benchmark": "cli_startup", "mode": "quick" if args.quick else "full",
        "machine": machine_info(), "rounds": ROUNDS, "target_seconds": TARGET_SECONDS,
        "help_meets_target": met, "median_seconds": medians, "seconds": times,
        "notes": ["Each run is a fresh process of the installed pyrogp script, timed from "
                  "start to exit; rounds are interleaved."],
    }
    print(f"JSON written to {write_json(out, payload)}")


if __name__ == "__main__":
    main()
