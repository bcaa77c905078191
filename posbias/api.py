"""The Python API; each function is what one CLI subcommand runs. A thin front: it calls down into
the task packages (`posbias.qa`, `posbias.tagging`) and the shared core; nothing imports it.

    import posbias
    summary = posbias.train("demo", overrides=["train.max_steps=20"])          # QA or tagging, by config
    metrics = posbias.evaluate("runs/demo/best", "dev.json")                    # the task of the checkpoint
    answers = posbias.predict("runs/demo/best", question="Who?", context="...")
    tags    = posbias.predict("runs/ner/best", text="Angela Merkel visited Paris.")
    scores  = posbias.score("dev.json", "predictions.json")                     # task="tagging" for CoNLL
    posbias.export("runs/demo/best", "hf_model/")
    posbias.experiment_run("smoke"); posbias.experiment_report("runs/experiments/smoke")
"""
from __future__ import annotations

from pathlib import Path

from . import outputs
from .config import DEFAULT_TASK, PRESETS, RunConfig, config_from, load_yaml, resolve_path
from .errors import ConfigError, DataError
from .hf_datasets import dataset_name, is_dataset_dict, is_hf_dataset
from .registry import DIAGNOSES


def load_config(spec=None, overrides=None) -> RunConfig:
    """Build and validate a run config.

    Args:
        spec: a bundled preset name (`demo`, `tiny`, ...), a YAML path, a mapping, or None for the
            defaults.
        overrides: `key.sub=value` strings (`["train.lr=1e-4"]`) or a mapping of dotted keys, applied
            on top of `spec`.

    Returns:
        The task's config dataclass (`posbias.qa.config.QAConfig`, `posbias.tagging.config.
        TaggingConfig`, ...), every key checked.

    Raises:
        ConfigError: an unknown key (with the closest known one), a wrong type or an out-of-range
            value, named by its dotted key.
    """
    return config_from(spec, overrides)


def train(config, overrides=None, resume: str | None = None, overwrite: bool = False,
          progress: bool = True, task: str | None = None, data=None) -> dict:
    """Train a model (`posbias train`; the loop is `posbias.training.train`).

    Args:
        config: a preset name, a YAML path, a mapping or a config object (`load_config`).
        overrides: `key.sub=value` overrides applied to `config`.
        resume: a checkpoint folder to continue from, or "auto" for `<output_dir>/checkpoints/last`.
        overwrite: start afresh in a train.output_dir that already holds a run.
        progress: show progress bars (a terminal) or periodic lines (a log file).
        task: when given (the CLI's `train qa` / `train tagging`), the config's task must match.
        data: Hugging Face `datasets` instead of data.train_file / data.eval_file: a DatasetDict
            (its `train` split, evaluated on `validation`, else `test`, when it has one) or a
            Dataset (training only). The config records each one's name, size and fingerprint.

    Returns:
        The run summary: `output_dir`, `steps`, `best_step`, `metric` and `best_metric`, timings
        and, with evaluation data, the final `eval` metrics.

    Raises:
        ConfigError: a config error, a task mismatch, or an output folder that holds another run.
    """
    # A mistake in the config, a data file or the output folder is answered before torch loads.
    cfg = config_from(config, overrides, run_paths=data is None)
    if task is not None and cfg.task != task:
        raise ConfigError(f"`train {task}` got a config for task {cfg.task!r}: use `posbias train {cfg.task}` "
                          f"or set task: {task} in the config")
    splits = None
    if data is not None:
        if not is_hf_dataset(data):
            raise ConfigError("data= takes a datasets.Dataset or DatasetDict (files go in data.train_file)")
        if not is_dataset_dict(data):
            splits = {"train": data, "eval": None}
        else:
            if "train" not in data:
                raise ConfigError(f"data=: the DatasetDict has no train split (splits: {list(data.keys())})")
            held_out = next((k for k in ("validation", "dev", "test") if k in data), None)
            splits = {"train": data["train"], "eval": data[held_out] if held_out else None}
        cfg.data.train_file = dataset_name(splits["train"])
        cfg.data.eval_file = dataset_name(splits["eval"]) if splits["eval"] is not None else None
    from .training import train as _train  # loads torch: `import posbias` and config errors stay light

    return _train(cfg, resume=resume, overwrite=overwrite, progress=progress, data=splits)


def _task_of(model, task: str | None):
    """The task object of a checkpoint folder (`posbias.tasks.checkpoint_task`)."""
    from .tasks import checkpoint_task  # loads torch and the tasks: `import posbias` stays light

    return checkpoint_task(model, task)


def evaluate(model, data, output_dir=None, overrides=None, progress: bool = True, task: str | None = None) -> dict:
    """Score a checkpoint on a data file (`posbias evaluate`).

    Args:
        model: a posbias checkpoint folder, or a Hugging Face *ForQuestionAnswering /
            *ForTokenClassification folder.
        data: the data file (QA: SQuAD JSON or MRQA JSONL; tagging: CoNLL / CoNLL-U), or a bundled
            alias such as `demo:dev`.
        output_dir: when given, predictions and metrics.json are written there.
        overrides: evaluation overrides, e.g. `["data.max_seq_len=256"]`.
        progress: show progress.
        task: the expected task (`qa`, `tagging`); a checkpoint of another task is an error.

    Returns:
        The metrics (QA: `exact_match`, `f1`, ...; tagging: `f1`, precision, recall, per class).
    """
    outputs.one_process("evaluate")
    return _task_of(model, task).evaluate_checkpoint(model, data, output_dir, overrides=overrides, progress=progress)


def predict(model, question: str | None = None, context: str | None = None, data=None, output_dir=None,
            n_best: int | None = None, overrides=None, progress: bool = False, text: str | None = None,
            task: str | None = None) -> dict:
    """Predict with a checkpoint (`posbias predict`).

    QA answers one question (`question` + `context`) or every question of `data`; tagging tags
    raw `text` (split into words) or every sentence of `data`.

    Args:
        model: a posbias checkpoint folder or an exported Hugging Face folder.
        question: QA: the question.
        context: QA: the passage that holds the answer.
        data: a data file to predict for instead of one input.
        output_dir: when given, the predictions are written there.
        n_best: QA: candidate answers to list (default: the model's decode.n_best).
        overrides: config overrides, e.g. `["data.max_seq_len=512"]`.
        progress: show progress.
        text: tagging: raw text to tag.
        task: the expected task of the checkpoint.

    Returns:
        id -> prediction. QA: {"answer", "probability", "start_char", "nbest"}; tagging:
        {"words", "tags", "entities"} (entities with character offsets for `text`).

    Raises:
        ConfigError: an input of another task's models (`text` for a QA model, ...).
    """
    outputs.one_process("predict")
    t = _task_of(model, task)
    given = {k: v for k, v in (("question", question), ("context", context), ("text", text)) if v is not None}
    wrong = [k for k in given if k not in t.predict_inputs]
    if wrong:
        raise ConfigError(f"a {t.name} model predicts from {' and '.join(f'--{k}' for k in t.predict_inputs)} or "
                          f"--data; --{wrong[0]} is for another task's models")
    return t.predict_checkpoint(model, data, output_dir, overrides=overrides, progress=progress, n_best=n_best,
                                **given)


def score(data, predictions, na_probs=None, version: str = "auto", task: str = DEFAULT_TASK, **options) -> dict:
    """Score a predictions file against a gold file, without a model (`posbias score`).

    Args:
        data: the gold file (QA: SQuAD / MRQA; tagging: CoNLL / CoNLL-U).
        predictions: QA: a JSON object question id -> answer text (the official format); tagging:
            CoNLL columns with the predicted tag last.
        na_probs: QA, SQuAD v2: a JSON object id -> no-answer probability.
        version: QA: `1.1`, `2.0`, or `auto` (from the gold file).
        task: `qa` (scored like the official SQuAD script) or `tagging`.
        **options: tagging: format, tag, tag_column, scheme (`posbias.tagging.metrics.score_files`).

    Returns:
        The metrics (QA: exact_match and f1, with HasAns / NoAns for v2; tagging: f1, precision,
        recall, per class).

    Raises:
        DataError: a predictions or na_probs path that is not a readable file.
    """
    for path in (predictions, na_probs):
        if path is not None and not Path(path).is_file():
            raise DataError(path, None, f"cannot read file: {'not a file' if Path(path).exists() else 'no such file'}")
    from .tasks import get_task  # loads torch and the tasks: `import posbias` stays light

    if na_probs is not None:
        options["na_probs"] = na_probs
    if version != "auto":
        options["version"] = version
    return get_task(task, "task").score_files(resolve_path(str(data)), predictions, **options)


def diagnose(model, data, output_dir, xs=None, overrides=None, progress: bool = True, task: str | None = None,
             bootstrap_samples: int = 2000, min_bucket: int = 30, quality_floor: float = 20.0, **options) -> dict:
    """Position analyses of a model, by its task (`posbias diagnose`).

    Every diagnosis opens with the verdict (`posbias.analysis.verdict`): the signed front − rear
    effect along position with a bootstrap interval, and a warning when the model's overall score
    is too low for the bias numbers to mean much. QA: answer-position quartiles and answer
    sentences, S_X segments, position-update counts. Tagging: the duplicated-test-set evaluation
    F1(α) / Prec(α) / Rec(α) with shift mode, per class, consistency and data statistics.
    A diagnosis of models no task trains, registered in `posbias.registry.DIAGNOSES` (the built-in ones
    and a plug-in's: see `posbias diagnose --help`), runs its own `diagnose` with the options it takes.

    Args:
        model: a posbias checkpoint or a Hugging Face folder of the task (a registered diagnosis: the
            model it reads).
        data: the evaluation data with gold answers / tags.
        output_dir: where diagnosis.md, .html, .json and the plots are written.
        xs: QA: the X of the S_X(1) / S_X(2) split, in tokens (default (100,)).
        overrides: evaluation overrides, e.g. `["data.max_seq_len=512"]`.
        progress: show progress.
        task: a task (`qa`, `tagging`) or a registered diagnosis; default: the checkpoint's task.
        bootstrap_samples: resamples for the verdict's intervals (0: point values only).
        min_bucket: fewest examples a position bucket needs to stand alone; smaller ones are merged.
        quality_floor: overall score (points) under which the report warns.
        **options: tagging: `k_max` (10), `quantiles` (a (low, high) pair; None for every sentence;
            default: the quantiles the model trained on, else (0.25, 0.75)), `modes`
            (("duplicate", "shift")), `max_len`, `batch_tokens` (`posbias.tagging.diagnose.diagnose`);
            a registered diagnosis: its own options.

    Returns:
        The diagnosis as written to diagnosis.json; its `verdict_lines` are what `posbias diagnose`
        prints.

    Raises:
        ConfigError: a verdict option out of range, or an option the task does not take.
    """
    from .analysis.verdict import check_verdict_options

    if task is not None and task in DIAGNOSES.names():  # a diagnosis of models no task trains: its own call
        if xs is not None or overrides:
            raise ConfigError(f"diagnose {task}: xs and overrides are options of the tasks' diagnoses, not of {task}'s")
        return DIAGNOSES.get(task).diagnose(model, data, output_dir, progress=progress,
                                            bootstrap_samples=bootstrap_samples, min_bucket=min_bucket,
                                            quality_floor=quality_floor, **options)
    outputs.one_process("diagnose")
    check_verdict_options(bootstrap_samples, min_bucket, quality_floor)
    common = {"bias_samples": bootstrap_samples, "min_bucket": min_bucket, "quality_floor": float(quality_floor)}
    if xs is not None:
        options["xs"] = xs
    return _task_of(model, task).diagnose(model, data, output_dir, overrides=overrides, progress=progress,
                                          **common, **options)


def explain_attention(model, question: str, context: str, output_dir, answer: str | None = None,
                      device: str = "auto") -> dict:
    """DyReF's query attention for one question and context (paper Fig. 3; `posbias explain attention`).

    Args:
        model: a posbias checkpoint with the `dynamic_query` head.
        question: the question.
        context: the passage.
        output_dir: where attention.png and attention.json are written.
        answer: the gold answer text, marked in the heat map.
        device: where the model runs: auto, cpu, cuda, cuda:N, mps.

    Returns:
        What attention.json holds: the tokens and the start / end queries' attention to each.
    """
    from .qa.explain import explain_attention as _explain  # loads torch (the QA task): `import posbias` stays light

    return _explain(model, question, context, output_dir, answer=answer, device=device)


def export(model, out_dir) -> Path:
    """Export a posbias checkpoint as a Hugging Face folder (`posbias export`).

    QA checkpoints (`independent` head) load with AutoModelForQuestionAnswering, tagging ones with
    AutoModelForTokenClassification. The folder is written beside `out_dir` under a temporary name
    and renamed when complete, so a failed export leaves no half-written folder.

    Args:
        model: the posbias checkpoint folder.
        out_dir: the new folder (or an empty one) to write, outside the checkpoint: an export never
            writes over anything.

    Returns:
        `out_dir`.

    Raises:
        ConfigError: `out_dir` is inside the checkpoint, a file, or a folder that is not empty.
    """
    import os
    import secrets
    import shutil

    src, out = Path(model).resolve(), Path(out_dir).resolve()
    if out == src or src in out.parents:
        raise ConfigError(f"export: {out_dir} is inside the checkpoint {model} being exported; "
                          "choose a new folder")
    if out.is_dir() and any(out.iterdir()):
        raise ConfigError(f"export: {out_dir} is a folder that is not empty; choose a new folder")
    if out.exists() and not out.is_dir():
        raise ConfigError(f"export: {out_dir} already exists (a file); choose a new folder")
    export_hf = _task_of(model, None).export_hf
    out.parent.mkdir(parents=True, exist_ok=True)
    with outputs.output_lock(out, "export --out"):  # a second export into `out` is refused, not mixed
        if out.is_dir() and any(out.iterdir()):  # written meanwhile
            raise ConfigError(f"export: {out_dir} is a folder that is not empty; choose a new folder")
        tmp = out.with_name(f"{out.name}.tmp-{secrets.token_hex(4)}")
        tmp.mkdir()
        try:
            export_hf(model, tmp)
            outputs.write_marker(tmp, "export")
            if out.is_dir():  # the empty folder the user made for it
                out.rmdir()
            os.replace(tmp, out)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return Path(out_dir)


def data_stats(data, output_dir=None, **options) -> dict:
    """Statistics of tagging files: sentences, length distribution, entities (or tags) per class
    (`posbias data stats`).

    Args:
        data: a CoNLL / CoNLL-U path, or a list of them.
        output_dir: when given, stats.md and stats.json are written there.
        **options: how the files are read: format, tag, tag_column, scheme, word_column
            (`posbias.tagging.stats.data_stats`).

    Returns:
        {"files": one statistics dict per file, "markdown": the same as a markdown table}.
    """
    from .tagging.stats import data_stats as _stats  # a task package: `import posbias` loads none

    return _stats(data, output_dir, **options)


def data_build(inputs, out_dir, **options) -> dict:
    """Build a QA data set from SQuAD/MRQA files: truncated contexts, splits, answer-sentence
    selection, with stats.md (`posbias data build`; options: see `posbias.qa.truncate.build_dataset`)."""
    from .qa.truncate import build_dataset  # a task package: `import posbias` loads none

    return build_dataset(inputs, out_dir, **options)


def demo(output_dir: str | None = None, overrides=None, progress: bool = True) -> dict:
    """The embedded default: fine-tune MiniLM on the bundled SQuAD slice and evaluate it."""
    extra = list(overrides or [])
    if output_dir:
        extra.append(f"train.output_dir={output_dir}")
    cfg = load_config("demo", extra)
    return train(cfg, overwrite=True, progress=progress)


def experiment_run(spec, output_dir=None, *, gpus=None, launcher: str = "local", launcher_options=None, **kw) -> dict:
    """Run (or resume) an experiment grid (`posbias experiment run`; `posbias.experiment.run.run_experiment`).

    Args:
        spec: an experiment YAML path, a mapping, or the name of a bundled spec (`smoke`).
        output_dir: where the grid's runs and experiment.sqlite go (default: the spec's output_dir).
        gpus: e.g. "0,1,2,3": one lane per GPU on one store (`posbias.experiment.cluster.run_lanes`).
        launcher: `local` (in this process), `accelerate` (each run via `accelerate launch`) or
            `submitit` (one cluster job per unfinished run, `posbias.experiment.cluster.submit_runs`).
        launcher_options: submitit's parameters, e.g. {"slurm_partition": "gpu", "timeout_min": 240}.
        **kw: the options of `run_experiment`: force, only, wait, dry_run, record, device, progress,
            accelerate_args.

    Returns:
        The runs this process trained (`ran`), found finished (`skipped_finished`), saw finished by
        other processes (`finished_by_others`) and left to them (`left_to_others`); with submitit,
        the submitted jobs.

    Raises:
        ConfigError: options that do not combine (`gpus` with another launcher, `dry_run` with
            `gpus`, ...).
    """
    from .experiment import run_experiment, run_lanes, submit_runs  # the experiment layer: loaded on first use

    spec = experiment_spec_path(spec)
    if launcher_options and launcher != "submitit":
        raise ConfigError("--submitit options are for --launcher submitit")
    if gpus is not None or launcher == "submitit":
        if kw.pop("dry_run", False):
            raise ConfigError(f"--dry-run prints the runs' own commands; leave out "
                              f"{'--gpus' if gpus is not None else '--launcher submitit'}")
        if gpus is not None and launcher != "local":
            raise ConfigError(f"--gpus runs its lanes locally; it does not combine with --launcher {launcher}")
        if kw.pop("accelerate_args", ""):
            raise ConfigError("--accelerate-args is for --launcher accelerate")
        if gpus is not None:
            return run_lanes(spec, output_dir, gpus=gpus, **kw)
        kw.pop("progress", None)  # a job's output goes to its log
        return submit_runs(spec, output_dir, options=launcher_options, **kw)
    return run_experiment(spec, output_dir, launcher=launcher, **kw)


def experiment_collect(spec, output_dir=None, only: list[str] | None = None) -> dict:
    """Record the runs whose training finished (cluster jobs) into the store and list the others;
    never trains. `spec`: a spec (path, bundled name or mapping) or an experiment folder (its
    experiment.yaml); see `posbias.experiment.run.collect_experiment`."""
    from .experiment import collect_experiment  # the experiment layer: loaded on first use

    if not isinstance(spec, dict) and Path(spec).is_dir():
        folder = Path(spec)
        if not (folder / "experiment.yaml").is_file():
            raise ConfigError(f"experiment collect: {folder} holds no experiment.yaml (written by `experiment run`, "
                              "also with --dry-run); give the spec instead")
        return collect_experiment(folder / "experiment.yaml", output_dir or folder, only=only)
    return collect_experiment(experiment_spec_path(spec), output_dir, only=only)


def experiment_copy(src_dir, dest_dir, force: bool = False) -> dict:
    """Copy finished runs' results (not checkpoints) between experiment folders
    (`posbias experiment copy`; `posbias.experiment.archive.copy_results`).

    Args:
        src_dir: the experiment folder holding experiment.sqlite.
        dest_dir: the folder to archive into, restore into, or join with (created if missing).
        force: replace runs finished in both with a different config.

    Returns:
        What was copied: the runs per outcome and what happened to the spec ("copied", "replaced",
        "kept" or None).
    """
    from .experiment import copy_results  # the experiment layer sits above the tasks: loaded on first use

    return copy_results(src_dir, dest_dir, force=force)


def experiment_report(exp_dir, bootstrap_samples: int = 10_000, *, only: list[str] | None = None,
                      baseline: str | None = None, output_dir=None) -> dict:
    """Write report.md, report.html and plots/ for an experiment folder (`posbias experiment report`).

    Args:
        exp_dir: the experiment folder (its experiment.sqlite).
        bootstrap_samples: resamples for the paired bootstrap intervals.
        only: run-name patterns (`n512/*`): report a sub-comparison.
        baseline: the method the differences are taken against (default: the spec's).
        output_dir: where the report goes (default: `exp_dir`).

    Returns:
        {"report_md", "report_html": their paths, "plots": the plot paths, "rows": table rows}.
    """
    from .experiment.report import write_report  # loads torch and the tasks: `import posbias` stays light

    with outputs.output_lock(output_dir or exp_dir, "experiment report: output folder"):  # one writer at a time
        return write_report(exp_dir, bootstrap_samples=bootstrap_samples, only=only, baseline=baseline,
                            output_dir=output_dir)


def experiment_spec_path(spec):
    """A spec path, or the name of a bundled experiment (configs/experiments/<name>.yaml)."""
    if isinstance(spec, dict) or Path(spec).is_file():
        return spec
    named = PRESETS / "experiments" / f"{spec}.yaml"
    if named.is_file():
        return named
    names = sorted(x.stem for x in (PRESETS / "experiments").glob("*.yaml"))
    raise ConfigError(f"experiment {spec!r} is neither a file nor a bundled experiment; bundled: {names}")


def presets() -> dict[str, dict]:
    return {p.stem: load_yaml(p) for p in sorted(PRESETS.glob("*.yaml"))}
