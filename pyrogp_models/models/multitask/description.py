"""What ``pyrogp info`` tells about a multitask file: a text description and a JSON-able summary.

Both give the kind, tasks, inputs, likelihood, M, the top layer's ARD weights ω = 1/ℓ² (Boustati
et al. eq. 10) and the fit as the file records it: the final ELBO (estimated precisely, see
:func:`pyrogp_models.inference.multitask_fit.estimate_elbo`), which state was kept (a deep model
that ended below the shallow model it contains keeps that embedding), the steps, seconds and
convergence of every phase, and the log likelihood of the best constant per task, which the
ELBO of a fit that learnt anything from its inputs exceeds.
"""

from __future__ import annotations

from pyrogp_models.models.multitask.families import SUMMARIES
from pyrogp_models.models.multitask.outputs import CoregionalisedGP
from pyrogp_models.models.multitask.prediction import MultitaskPredictor
from pyrogp_models.text import format_number, format_table

#: The fit record's keys that a summary repeats.
FIT_KEYS = ("elbo", "constant_log_likelihood", "kept", "steps", "seconds", "training_seconds",
            "converged", "phases")


def multitask_summary(predictor: MultitaskPredictor) -> dict:
    """The model and its fit as JSON-able values."""
    model, info = predictor.model, predictor.info
    tasks = info.get("tasks") or [str(t) for t in range(model.num_tasks)]
    parameters = {key: value.detach().tolist()
                  for key, value in model.likelihood.parameter_values().items()}
    return {"model": model.kind, "summary": SUMMARIES[model.kind], "tasks": tasks,
            "num_data": info.get("num_data"),
            "features": info.get("features") or [f"x{d}" for d in range(model.input_dim)],
            "likelihood": {"name": model.likelihood.name, **model.likelihood.options(),
                           **parameters},
            "num_inducing": model.options.num_inducing,
            "learn_inducing": model.options.learn_inducing,
            "ard_weights": model.ard_weights().detach().tolist(),
            "noise_correlation": (None if model.site_noise is None
                                  else model.site_noise.correlation().detach().tolist()),
            "shared_columns": model.latent.shared_width if model.is_deep else None,
            "top_mean": model.options.top_mean,
            "predictive_samples": predictor.num_samples if model.is_deep else 1,
            **{key: info[key] for key in FIT_KEYS if key in info}}


def describe_multitask(predictor: MultitaskPredictor) -> str:
    """The kind, tasks, layer sizes, per-task likelihood parameters, top-layer ARD weights and
    the fit (final ELBO, kept state, phases) of a multitask model, as lines of text."""
    model, info = predictor.model, predictor.info
    summary = multitask_summary(predictor)
    likelihood = model.likelihood
    options = ", ".join(f"{key}={value}" for key, value in likelihood.options().items())
    lines = [f"multitask model: {model.kind} ({summary['summary']})",
             f"{model.num_tasks} tasks, {model.input_dim} input{'s' * (model.input_dim > 1)} "
             f"({', '.join(summary['features'])}); "
             f"likelihood {likelihood.name}" + (f" ({options})" if options else ""),
             f"M = {model.options.num_inducing} inducing inputs per process"
             + (" (fixed)" if model.options.learn_inducing is False else "") + "; q(u) shapes: "
             + ", ".join(f"{name} {list(layer.q_mean.shape)}"
                         for name, layer in model.variational_sites())]
    weights = model.ard_weights().detach()
    per_task = not isinstance(model.top, CoregionalisedGP)
    if not per_task:
        lines.append(f"coregionalisation {model.options.coregionalisation}: "
                     f"{model.options.coregional_rank} latent GPs mixed into every output")
    parameters = {key: value.detach() for key, value in likelihood.parameter_values().items()}
    counts = summary["num_data"]

    def row_text(row) -> str:
        return ", ".join(format_number(value, 3) for value in row.tolist())

    rows = [(name, counts[t] if counts else "-",
             *(format_number(float(value[t]), 4) for value in parameters.values()),
             *([row_text(weights[t])] if per_task else []))
            for t, name in enumerate(summary["tasks"])]
    lines += ["", format_table(["task", "N", *parameters, *(["ARD weights"] if per_task else [])],
                               rows), ""]
    if not per_task:
        lines.append("ARD weights of the shared top-layer kernel(s): "
                     + " | ".join(row_text(row) for row in weights))
    if model.site_noise is not None:
        lines.append("correlation of the noise of the outputs observed at one input: "
                     + " | ".join(row_text(row)
                                  for row in model.site_noise.correlation().detach()))
    if model.is_deep:
        lines.append(f"ARD weights are over the {weights.shape[-1]} columns of the latent space "
                     f"λ, the first {model.latent.shared_width} from shared processes")
        lines.append("top-layer mean: " + ("learned, linear in λ (no prior)"
                                           if model.options.top_mean == "linear" else "zero"))
    if "elbo" in info:
        status = "converged" if info.get("converged") else "not converged"
        kept = info.get("kept")
        kept_text = f", kept at the {kept} it contains" if kept and kept != model.kind else ""
        seconds = (f", {info['training_seconds']:.1f} s of training, {info['seconds']:.1f} s "
                   "in all" if "training_seconds" in info  # files before it: training only
                   else f", {info['seconds']:.1f} s" if "seconds" in info else "")
        constant = info.get("constant_log_likelihood")  # files before it: not recorded
        above = ("" if constant is None else
                 f" ({info['elbo'] - constant:.6g} above a constant per task's log likelihood, "
                 f"{constant:.6g})")
        lines.append(f"fit: final ELBO {info['elbo']:.6g}{above}{kept_text}, "
                     f"{info.get('steps')} steps{seconds}, {status}")
        lines += [f"  phase {phase['model']}: {_phase_text(phase)}"
                  for phase in info.get("phases", [])]
    if "targets" in info:
        lines.append(f"table: task column '{info['task_column']}', target '{info['targets'][0]}'"
                     if info.get("task_column") else "table: one target column per task")
    if model.is_deep:
        lines.append(f"predictions: a mixture of S = {predictor.num_samples} draws of λ")
    lines.append("kernel hyperparameters and Gaussian noise refer to the standardised data")
    return "\n".join(lines)


def dropped(elbo: float | None, held_out: float | None) -> bool:
    """Whether a candidate with this ELBO and held-out error was dropped: a fit to its held-out
    folds failed, so it has neither."""
    return elbo is None and held_out is None


def _phase_text(phase: dict) -> str:
    """A recorded phase: its training (a candidate not kept has no ELBO: fitted to its held-out
    folds only, or dropped where such a fit failed) and its held-out MSE where it has one."""
    held_out = phase.get("held_out")
    if phase["elbo"] is not None:
        text = (f"{phase['steps']} steps, {phase['seconds']:.1f} s, "
                f"{'converged' if phase['converged'] else 'not converged'}, "
                f"ELBO {phase['elbo']:.6g}")
    elif dropped(phase["elbo"], held_out):
        return "dropped: a fit to its held-out folds failed"
    else:
        text = "fitted to its held-out folds only"
    return text if held_out is None else f"{text}, held-out MSE {held_out:.4g}"
