"""``pyrogp recycle``: fit a meta-GP to modules (and optional raw data) and save it as a module.

The meta-GP file is an ordinary module: ``evaluate``, ``predict``, ``info`` and ``recycle``
itself accept it, so meta-GPs can be recycled again (pyramids).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from pyrogp_models.inference.commands.arguments import (
    LIKELIHOOD_NAMES,
    add_float32,
    add_kernel,
    add_seed,
)
from pyrogp_models.inference.train_config import (
    COLLAPSED_CONFIG,
    MAX_DEFAULT_INDUCING,
    UNCOLLAPSED_CONFIG,
)

from pyrogp_models.text import count_of

NAME = "recycle"
HELP = "fit a meta-GP to module files and folders (and new raw data) and save it as a module"

ON_UNBOUNDED = ("raise", "warn", "repair")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("paths", metavar="DIR_OR_FILE", type=Path, nargs="+",
                        help="module files and module folders to recycle")
    parser.add_argument("--inducing", type=int, metavar="M",
                        help="inducing inputs of the meta-GP (default: half the modules' "
                             "inducing inputs and raw rows, at most "
                             f"{MAX_DEFAULT_INDUCING})")
    bound = parser.add_mutually_exclusive_group()
    bound.add_argument("--collapsed", action="store_true",
                       help="learn the kernel and inducing inputs on the collapsed bound (q at "
                            "its optimum); the default unless --data is non-Gaussian")
    bound.add_argument("--uncollapsed", action="store_true",
                       help="learn q too (natural-gradient steps), the kernel and inducing "
                            "inputs by Adam")
    add_kernel(parser, None, "the kernel most modules share, with the median of their "
                                      "values")
    parser.add_argument("--data", type=Path, metavar="RAW",
                        help="new raw data (CSV or .npz) fitted together with the modules")
    parser.add_argument("--target", help="the observed column of --data (default: the "
                                         "modules' target)")
    parser.add_argument("--likelihood", choices=LIKELIHOOD_NAMES, metavar="NAME",
                        help="likelihood of the raw data and of the saved meta-GP (default: "
                             "the modules' common likelihood)")
    parser.add_argument("--steps", type=int, metavar="N",
                        help=f"maximum optimiser steps (default: {COLLAPSED_CONFIG.steps} L-BFGS "
                             f"steps for the collapsed bound, {UNCOLLAPSED_CONFIG.steps} Adam "
                             "steps otherwise)")
    parser.add_argument("--lr", type=float, metavar="LR",
                        help=f"Adam learning rate of the uncollapsed bound (default: "
                             f"{UNCOLLAPSED_CONFIG.lr:g})")
    add_seed(parser, "the initial inducing inputs and the training draws")
    add_float32(parser)
    parser.add_argument("--on-unbounded", choices=ON_UNBOUNDED, default="raise",
                        help="when the ensemble bound is unbounded above: stop (raise), go on "
                             "with a warning, or repair the modules' site precisions first "
                             "(default: raise)")
    parser.add_argument("--out", required=True, type=Path, metavar="FILE",
                        help="meta-GP module file to write (.safetensors is appended if "
                             "missing)")


def run(args: argparse.Namespace) -> int:
    import sys
    import warnings
    from dataclasses import replace

    import torch
    from pyrogp_models.inference.commands.common import check_output, one_line_warnings
    from pyrogp_models.inference.recycling import RecycleSpec, recycle, uses_collapsed_bound

    from pyrogp_models.errors import (
        DataError,
        MixedLikelihoodsError,
        UnboundedBoundError,
    )
    from pyrogp_models.kernels import kernel_text
    from pyrogp_models.models.meta.boundedness import UnboundedBoundWarning, describe_unbounded
    from pyrogp_models.modules.files import MODULE_FILE, SUFFIX, save_module

    if args.inducing is not None and args.inducing < 1:
        raise DataError(f"--inducing must be at least 1, got {args.inducing}")
    if args.target is not None and args.data is None:
        raise DataError("--target applies to the raw data of --data")
    out = args.out if args.out.name.endswith(SUFFIX) else args.out.with_name(args.out.name
                                                                               + SUFFIX)
    check_output(out, MODULE_FILE.name)
    modules = _load_all(args.paths)
    spec = RecycleSpec(num_inducing=args.inducing,
                       collapsed=True if args.collapsed else False if args.uncollapsed else None,
                       on_unbounded="warn" if args.on_unbounded == "warn" else "raise",
                       repair_sites=args.on_unbounded == "repair", likelihood=args.likelihood,
                       kernel=args.kernel, name=out.name.removesuffix(SUFFIX),
                       dtype=torch.float32 if args.float32 else torch.float64)
    try:
        raw = _raw_data(args, modules) if args.data is not None else None
        collapsed = uses_collapsed_bound(spec, raw, modules)
        if collapsed and args.lr is not None:
            raise DataError("--lr sets Adam's learning rate of the uncollapsed bound; the "
                            "collapsed bound is fitted by L-BFGS")
        config = replace(COLLAPSED_CONFIG if collapsed else UNCOLLAPSED_CONFIG, seed=args.seed,
                         progress=sys.stderr.isatty())
        config = replace(config, **{key: value for key, value in
                                    (("steps", args.steps), ("lr", args.lr))
                                    if value is not None})
        with one_line_warnings("raise --steps"):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always", UnboundedBoundWarning)
                fit = recycle(modules, spec, config, raw)
            _report_warnings(caught)
    except UnboundedBoundError as error:  # advise the flag, not the Python API
        advice = ("; rerun with --on-unbounded repair to clip the modules' site precisions"
                  if args.on_unbounded != "repair" else
                  " even with the modules' site precisions clipped (--on-unbounded repair): "
                  "the global kernel moved away from the modules'")
        raise UnboundedBoundError(describe_unbounded(error.smallest, error.modules) + advice,
                                  error.smallest, error.modules) from error
    except MixedLikelihoodsError as error:
        raise MixedLikelihoodsError(f"the modules have different likelihoods ({error.found}); "
                                    "name the meta-GP's with --likelihood", error.found
                                    ) from error
    meta, result, module = fit.model, fit.result, fit.module
    save_module(module, out)
    repairs = module.info["recycle"]["site_repairs"]
    clipped = {name: count for name, count in repairs.items() if count}
    status = "converged" if result.converged else "not converged"
    sources = (f"{count_of(len(modules), 'module')} "
               f"(N = {sum(m.num_data for m in modules.values())})")
    if raw is not None:
        sources += f" and {len(raw.y)} raw points"
    print(f"recycled {sources} into a meta-GP with M = {meta.num_inducing} "
          f"(kernel {kernel_text(module.data_unit_kernel(), 3)}, "
          f"{'collapsed' if collapsed else 'uncollapsed'} bound)")
    if clipped:
        print(f"site repair clipped {count_of(sum(clipped.values()), 'direction')} in "
              f"{count_of(len(clipped), 'module')}: {', '.join(clipped)}")
    print(f"ensemble bound {module.info['ensemble_bound']:.6g} (ELBO {module.elbo:.6g} with the "
          f"modules' own, as info shows it), λ_min(Λ_w) = {meta.min_precision_eigenvalue():.4g}; "
          f"{result.steps} steps, {status}")
    print(f"written to {out}")
    return 0


def _load_all(paths: list[Path]) -> dict:
    """Every module of every path, by name; when names clash between paths every module is
    named by its path as well (``siteA/part000``; a file by its path without ``.safetensors``),
    so folders of modules with the same names recycle together. A module file given twice is
    refused."""
    from pyrogp_models.errors import DataError
    from pyrogp_models.modules.files import SUFFIX, load_module, module_files, resolve_path

    files = [module_files(path) for path in paths]
    seen: dict[Path, Path] = {}
    for path, found in zip(paths, files, strict=True):
        for file in found.values():
            if file.resolve() in seen:
                raise DataError(f"module file {file} is given twice ({seen[file.resolve()]} and "
                                f"{path}); recycle each module once")
            seen[file.resolve()] = path
    names = [name for found in files for name in found]
    qualify = len(set(names)) < len(names)
    modules: dict = {}
    for path, found in zip(paths, files, strict=True):
        label = str(path).rstrip("/").removesuffix(SUFFIX)
        folder = resolve_path(path).is_dir()
        for name, file in found.items():
            modules[(f"{label}/{name}" if folder else label) if qualify else name] = \
                load_module(file)
    return modules


def _raw_data(args: argparse.Namespace, modules: dict):
    """The --data table as raw data: the modules' features, the target column (default: the
    modules'), the --likelihood (default: the modules' common one, chosen by the library)."""
    from pyrogp_models.inference.commands.common import read_inputs
    from pyrogp_models.inference.recycling import RawData

    from pyrogp_models.data import load_table, require_finite
    from pyrogp_models.errors import DataError

    first = next(iter(modules.values()))
    target = args.target or first.columns.target
    if target is None:
        raise DataError("the modules do not record their target column; pass --target")
    table = load_table(args.data)
    y = table.column(target)
    require_finite(y, f"column '{target}'")
    _, X, _ = read_inputs(table, first, exclude=(target,))
    return RawData(X, y, args.likelihood)


def _report_warnings(caught: list) -> None:
    """One line for the first unboundedness warning (with how often it recurred); other
    warnings are issued again as they were."""
    import sys
    import warnings

    from pyrogp_models.models.meta.boundedness import UnboundedBoundWarning, describe_unbounded

    unbounded = [w for w in caught if issubclass(w.category, UnboundedBoundWarning)]
    for w in caught:
        if w not in unbounded:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    if unbounded:
        first = unbounded[0].message
        again = f", warned {len(unbounded)} times" if len(unbounded) > 1 else ""
        print(f"pyrogp: warning: {describe_unbounded(first.smallest, first.modules)}; went on as "
              f"--on-unbounded warn asks{again} (--on-unbounded repair clips the modules' site "
              "precisions)", file=sys.stderr)
