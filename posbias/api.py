"""The Python API; each function is what one CLI subcommand runs.

    import posbias
    summary = posbias.train("configs/demo.yaml", overrides=["train.max_steps=20"])
    metrics = posbias.evaluate("runs/demo/best", "dev.json")
    answers = posbias.predict("runs/demo/best", question="Who?", context="...")
    scores  = posbias.score("dev.json", "predictions.json")
    posbias.export("runs/demo/best", "hf_model/")
    posbias.experiment_run("smoke"); posbias.experiment_report("runs/experiments/smoke")
"""
from __future__ import annotations

import time
from pathlib import Path

from .config import PACKAGE_DIR, RunConfig, build_config, load_config as _load_config, load_yaml, save_config
from .errors import ConfigError

PRESETS = PACKAGE_DIR / "configs"


def preset_path(spec) -> Path:
    """A YAML path, or the name of a bundled preset (`demo`, `tiny`, ...)."""
    p = Path(spec)
    if p.is_file():
        return p
    named = PRESETS / f"{spec}.yaml"
    if named.is_file():
        return named
    names = sorted(x.stem for x in PRESETS.glob("*.yaml"))
    raise ConfigError(f"config {spec!r} is neither a file nor a preset; presets: {names}")


def load_config(spec=None, overrides=None) -> RunConfig:
    """Config from a preset name / YAML path / dict, plus `key.sub=value` overrides."""
    if isinstance(spec, RunConfig):
        return build_config(spec.to_dict(), overrides)
    if isinstance(spec, dict):
        return build_config(spec, overrides)
    return _load_config(preset_path(spec) if spec is not None else None, overrides)


def train(config, overrides=None, resume: str | None = None, overwrite: bool = False,
          progress: bool = True) -> dict:
    """Train a QA model (see `posbias.training.train`); returns the run summary."""
    from .training import train as _train

    return _train(load_config(config, overrides), resume=resume, overwrite=overwrite, progress=progress)


def _checkpoint_config(model_cfg: RunConfig, overrides) -> RunConfig:
    # Evaluation settings (windows, decoding, batch size) may be overridden; the model may not.
    cfg = build_config(model_cfg.to_dict(), overrides)
    if cfg.model != model_cfg.model:
        raise ConfigError("model.* cannot be overridden when evaluating a trained checkpoint")
    return cfg


def evaluate(model, data, output_dir=None, overrides=None, progress: bool = True) -> dict:
    """Score a checkpoint (posbias or Hugging Face QA folder) on a QA file; writes predictions
    and metrics into `output_dir` when given."""
    from .inference import evaluate_dataset, read_dataset
    from .model import load_checkpoint

    net, tokenizer, mcfg = load_checkpoint(model)
    cfg = _checkpoint_config(mcfg, overrides)
    ds = read_dataset(data, cfg.data.on_bad_record)
    if cfg.data.max_eval_examples:
        ds.examples = ds.examples[: cfg.data.max_eval_examples]
    t0 = time.time()
    result = evaluate_dataset(net, tokenizer, cfg, ds, output_dir, progress=progress)
    if output_dir is not None:
        _write_run_meta(output_dir, cfg, "evaluate", model, ds.path, t0, skipped=ds.skipped)
    return result


def _write_run_meta(output_dir, cfg: RunConfig, command: str, model, data, t0: float, skipped=()) -> None:
    """config.yaml + run_info.json next to an evaluation's or prediction's outputs."""
    from .utils import atomic_write_json, now_iso, versions

    save_config(cfg, Path(output_dir) / "config.yaml")
    atomic_write_json(Path(output_dir) / "run_info.json", {
        "command": command, "model": str(model), "data": str(data), "finished": now_iso(),
        "seconds": round(time.time() - t0, 2), "skipped_records": len(skipped), "skipped": list(skipped)[:100],
        "seed": cfg.train.seed, "versions": versions()})


def predict(model, question: str | None = None, context: str | None = None, data=None,
            output_dir=None, n_best: int | None = None, overrides=None, progress: bool = False) -> dict:
    """Answer one question (question + context) or every question of a file.

    Returns id -> {"answer", "probability", "start_char", "nbest"}; with `output_dir`, also writes
    predictions.json, nbest.json, null_odds.json.
    """
    from .data.examples import QAExample
    from .inference import predict_examples, read_dataset, write_predictions
    from .model import load_checkpoint

    if (question is None) != (context is None) or (question is None) == (data is None):
        raise ConfigError("predict needs either question and context, or data")
    net, tokenizer, mcfg = load_checkpoint(model)
    extra = {"decode": {"n_best": n_best}} if n_best else {}
    cfg = _checkpoint_config(mcfg, overrides)
    if extra:
        cfg = build_config(cfg.to_dict(), extra)
    t0 = time.time()
    skipped = []
    if data is not None:
        ds = read_dataset(data, cfg.data.on_bad_record)
        examples, source, skipped = ds.examples, ds.path, ds.skipped
    else:
        if not question.strip() or not context.strip():
            raise ConfigError("question and context must be non-empty")
        examples, source = [QAExample(id="q0", question=question, context=context)], "<command line>"
    preds, nbest, null_odds, _, _ = predict_examples(net, tokenizer, cfg, examples, source=source,
                                                     progress=progress)
    if output_dir is not None:
        write_predictions(output_dir, preds, nbest, null_odds)
        _write_run_meta(output_dir, cfg, "predict", model, source, t0, skipped=skipped)
    result = {}
    for e in examples:
        top = next((c for c in nbest[e.id] if c["text"] == preds[e.id]), None)
        result[e.id] = {"answer": preds[e.id], "probability": top["probability"] if top else None,
                        "start_char": top["start_char"] if top else -1, "nbest": nbest[e.id]}
    return result


def score(data, predictions, na_probs=None, version: str = "auto") -> dict:
    """Score an official-format predictions file (id -> text) like the official SQuAD script."""
    from .config import resolve_path
    from .metrics import score_files

    return score_files(resolve_path(str(data)), predictions, na_probs, version=version)


def diagnose(model, data, output_dir, xs=(100,), overrides=None, progress: bool = True) -> dict:
    """Position analyses (answer-position quartiles, S_X segments, update counts) of a QA model."""
    from .analysis.diagnose import diagnose as _diagnose

    return _diagnose(model, data, output_dir, xs=xs, overrides=overrides, progress=progress)


def export(model, out_dir) -> Path:
    """posbias checkpoint (independent head) -> Hugging Face AutoModelForQuestionAnswering folder."""
    from .model import export_hf

    return export_hf(model, out_dir)


def demo(output_dir: str | None = None, overrides=None, progress: bool = True) -> dict:
    """The embedded default: fine-tune MiniLM on the bundled SQuAD slice and evaluate it."""
    extra = list(overrides or [])
    if output_dir:
        extra.append(f"train.output_dir={output_dir}")
    cfg = load_config("demo", extra)
    return train(cfg, overwrite=True, progress=progress)


def experiment_run(spec, output_dir=None, **kw) -> dict:
    """Run (or resume) an experiment grid; see `posbias.experiment.run_experiment`."""
    from .experiment import run_experiment

    return run_experiment(experiment_spec_path(spec), output_dir, **kw)


def experiment_report(exp_dir, bootstrap_samples: int = 10_000) -> dict:
    """Write report.md, report.html and plots/ for an experiment folder."""
    from .analysis.report import write_report

    return write_report(exp_dir, bootstrap_samples=bootstrap_samples)


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
