"""A trained run's results, read from its folder into the rows the store keeps: its metrics (each eval
set scored with its best checkpoint), per-example scores, segment metrics, learning curves and
position-embedding updates, and the versions it trained with.
"""
from __future__ import annotations

import json
from pathlib import Path

from ..analysis.updates import PositionUpdateCounter
from ..registry import SEGMENTERS
from .spec import Experiment, Run


def score_run(exp: Experiment, run: Run) -> None:
    """Score a trained run's best checkpoint on each of the experiment's `eval_sets` (whole:
    data.max_eval_examples caps only the validation set) and `position_eval`, into its folder
    (`evals/<name>`, `position_eval/<name>`); those already scored are left as they are. Called by
    the process that trained the run (a lane, a cluster job), so that scoring runs on its device."""
    from ..tasks import get_task  # loads the task packages, and torch: on first use

    task = get_task(run.config.task)
    out = run.output_dir
    d = run.config.data
    overrides = [f"train.device={run.config.train.device}", *_trained_as(run),  # where, (imported) which D*,
                 *(f"model.head_options.{k}={json.dumps(v)}" for k, v in run.decode.items())]  # and how it decodes
    quantiles = getattr(d, "length_quantiles", None) if run.checkpoint is not None else None
    if run.checkpoint is not None and d.eval_file and not (out / "eval" / "metrics.json").is_file():
        # a model trained elsewhere: its validation score, as training would have left it in eval/
        # (the first data.max_eval_examples, tagging: of D* when the runs train on D*)
        task.evaluate_checkpoint(run.model_dir, d.eval_file, out / "eval", progress=False,
                                 overrides=[f"data.max_eval_examples={d.max_eval_examples or 'null'}", *overrides]
                                 + ([f"data.length_quantiles={json.dumps(list(quantiles))}"] if quantiles else []))
    for name, path in exp.eval_sets.items():
        target = out / "evals" / name
        if not (target / "metrics.json").is_file():
            task.evaluate_checkpoint(run.model_dir, path, target, progress=False,
                                     overrides=["data.max_eval_examples=null", *overrides])
    for name, options in exp.position_eval.items():
        target = out / "position_eval" / name
        if not (target / "diagnosis.json").is_file():
            opts = {k: v for k, v in options.items() if k != "alphas"}
            if quantiles and "quantiles" not in opts:  # D* as the experiment's runs define it
                opts["quantiles"] = tuple(quantiles)
            task.position_eval_checkpoint(run.model_dir, exp.eval_sets[name], target, opts, overrides=overrides)


def _trained_as(run: Run) -> list[str]:
    """A model trained elsewhere knows nothing of the experiment's data config. Tagging: its D*
    (`data.length_pool` and the files whose pooled lengths bound it), so that its F1(alpha) and
    validation score are over the same sentences as the trained methods'; and how its sub-tokens
    were labelled (`data.label_subtokens`: `copy`, the authors' `label_all_tokens`, makes the authors'
    sub-token F1 read each sub-token's own prediction), as the spec (or the method's `data:`) states."""
    d = run.config.data
    if run.checkpoint is None:
        return []
    out = []
    if getattr(d, "length_pool", None) is not None:
        files = d.length_pool_files if d.length_pool_files is not None else [f for f in (d.train_file, d.eval_file) if f]
        out += [f"data.length_pool={d.length_pool}", f"data.length_pool_files={json.dumps(files)}"]
    if getattr(d, "label_subtokens", None) is not None:
        out.append(f"data.label_subtokens={d.label_subtokens}")
    return out


def collect_results(exp: Experiment, run: Run) -> dict:
    """Metrics, per-example scores, segment metrics and learning curves of a trained run, and the
    versions its training recorded when it (re)started (`run_info.json`): the code that trained it,
    not the checkout's now, which may have moved on while it trained.

    The validation set is the run's `data.eval_file` (scored during training by its best
    checkpoint); each of the experiment's `eval_sets` is scored with that checkpoint (`score_run`),
    now unless the process that trained the run did.
    """
    from ..evaluation import eval_config  # loads torch: on first use
    from ..tasks import get_task  # loads the task packages, and torch: on first use

    task = get_task(run.config.task)
    out = run.output_dir
    info = json.loads((out / "run_info.json").read_text(encoding="utf-8"))
    score_run(exp, run)
    sets = {}
    if run.config.data.eval_file:
        sets["val"] = (run.config.data.eval_file, out / "eval")
    for name, path in exp.eval_sets.items():
        sets[name] = (path, out / "evals" / name)
    metrics, questions, segments, copies = {}, {}, [], {}
    for name, options in exp.position_eval.items():
        result = json.loads((out / "position_eval" / name / "diagnosis.json").read_text(encoding="utf-8"))
        metrics[f"{name} D*(k)"] = task.position_metrics(result, options.get("alphas", (5, 10)))
        per_copy = out / "position_eval" / name / "copy_scores.npz"  # tagging.duplicated.COPY_SCORES
        if per_copy.is_file():
            copies[f"{name} D*(k)"] = per_copy.read_bytes()
    for name, (path, folder) in sets.items():
        # The validation set as training read it; eval sets whole, as they were scored.
        ds = task.read(path, run.config if name == "val" else eval_config(run.config, None))
        if name == "val" and run.config.data.max_eval_examples:
            ds.examples = ds.examples[: run.config.data.max_eval_examples]
        metrics[name] = json.loads((folder / "metrics.json").read_text(encoding="utf-8"))
        scores = task.example_scores(ds, folder, info)
        questions[name] = scores
        for seg_name, seg_fn, seg_options in exp.segments:
            labels = SEGMENTERS.get(seg_fn)(ds.examples, folder, run.model_dir, **seg_options)
            for label in sorted(set(labels.values())):
                qids = [q for q, lab in labels.items() if lab == label and q in scores]
                em = sum(scores[q][0] for q in qids) / max(len(qids), 1) * 100
                f1 = sum(scores[q][1] for q in qids) / max(len(qids), 1) * 100
                segments.append((name, seg_name, str(label), len(qids), em, f1))
    curves = {}  # (kind, step) -> value: a step logged twice counts once, with its last value
    for r in _log_records(out / "train_log.jsonl"):
        curves["loss", r["step"]] = r["loss"]
        for k, v in (r.get("stats") or {}).items():  # the model's training scalars (learned-mixin gate)
            curves[k, r["step"]] = v
    for r in _log_records(out / "eval_log.jsonl"):
        name, value = task.main_metric(r)
        curves[f"val_{name}", r["step"]] = value
    curves.update(position_update_curve(out / "position_updates.json"))
    return {"metrics": metrics, "questions": questions, "segments": segments,
            "curves": [(kind, step, value) for (kind, step), value in curves.items()],
            "copies": copies, "versions": info.get("versions")}


def position_update_curve(path: Path) -> dict:
    """A run's position-embedding updates as curve points: ("position_updates", position id) -> the
    fraction of optimizer steps in which that id got a gradient. Kept in the store (not only in the
    run folder), so an archive made by `experiment copy` still holds the positions each run trained.
    No points for a run that wrote no counts; a damaged file counts as none."""
    try:
        fractions = PositionUpdateCounter.fractions(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, KeyError, TypeError):
        return {}
    return {("position_updates", i): float(f) for i, f in enumerate(fractions)}


def _log_records(path: Path) -> list[dict]:
    """The records of a JSON-lines log (none if it is missing); a line cut short by a crash is skipped."""
    if not path.is_file():
        return []
    records = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records
