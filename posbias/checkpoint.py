"""Checkpoints, for every task: one folder with safetensors weights, the encoder's config.json, the
tokenizer, the run config (posbias.yaml) and the task model's own metadata (posbias_model.json).

`load_checkpoint` also opens Hugging Face `*ForQuestionAnswering` / `*ForTokenClassification`
folders, so models trained elsewhere can be evaluated and diagnosed here.
"""
from __future__ import annotations

import json
from pathlib import Path

from .config import RunConfig, load_config, save_config
from .encoders import local_dir
from .errors import ConfigError
from .utils import atomic_write_json

CHECKPOINT_CONFIG = "posbias.yaml"
WEIGHTS = "model.safetensors"
MODEL_META = "posbias_model.json"


def save_checkpoint(model, cfg: RunConfig, tokenizer, out_dir, extra: dict | None = None) -> None:
    """Write a self-contained checkpoint of a task model (any object with `encoder`, `head_name`
    and `meta()`, the JSON-able facts needed to rebuild it, e.g. its label list)."""
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    save_file(state, str(out / WEIGHTS), metadata={"format": "pt", "posbias_head": model.head_name})
    model.encoder.config.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    save_config(cfg, out / CHECKPOINT_CONFIG)
    atomic_write_json(out / MODEL_META, {**model.meta(), **(extra or {})})


def is_posbias_checkpoint(path) -> bool:
    return (Path(path) / CHECKPOINT_CONFIG).is_file() and (Path(path) / WEIGHTS).is_file()


def load_checkpoint(path, map_location="cpu", task: str | None = None):
    """(model, tokenizer, run config) of a posbias checkpoint or a Hugging Face task folder.

    Args:
        task: the task the caller expects (`qa`, `tagging`); a checkpoint of another task is an error.
    """
    from safetensors.torch import load_file
    from transformers import AutoConfig

    from .tasks import all_tasks, get_task

    path = str(path)
    local_dir(path, "checkpoint")
    if is_posbias_checkpoint(path):
        cfg = load_config(Path(path) / CHECKPOINT_CONFIG)
        if task is not None and cfg.task != task:
            raise ConfigError(f"{path} is a {cfg.task} checkpoint, not a {task} one")
        meta = json.loads((Path(path) / MODEL_META).read_text(encoding="utf-8"))
        model, tokenizer = get_task(cfg.task).load_model(path, cfg, meta)
        model.load_state_dict(load_file(str(Path(path) / WEIGHTS), device=str(map_location)))
        return model, tokenizer, cfg
    try:
        config = AutoConfig.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError) as e:
        raise ConfigError(f"{path} is neither a posbias checkpoint nor a Hugging Face model folder: {e}") from None
    archs = config.architectures or []
    tasks = [t for t in all_tasks() if task in (None, t.name)]
    for t in tasks:
        if any(a.endswith(t.hf_suffix) for a in archs):
            return t.load_hf(path, config)
    wanted = " or ".join(f"*{t.hf_suffix}" for t in tasks)
    raise ConfigError(f"{path}: config.json architectures {archs} has no {wanted} model; to train from a "
                      f"bare encoder use `posbias train {task or 'TASK'}` with model.name_or_path")


def eval_config(model_cfg: RunConfig, overrides) -> RunConfig:
    """A checkpoint's run config with evaluation overrides (windows, decoding, batch size); the
    model itself may not be overridden. The training run's cap on evaluation examples does not carry
    over: a file given for evaluation is scored whole unless `data.max_eval_examples` (or, tagging,
    `data.length_quantiles`) is overridden."""
    from .config import build_config

    d = model_cfg.to_dict()
    d["data"]["max_eval_examples"] = None
    if "length_quantiles" in d["data"]:  # a tagging run trained on D*: other files are read whole
        d["data"]["length_quantiles"] = None
    cfg = build_config(d, overrides)
    if cfg.model != model_cfg.model:
        raise ConfigError("model.* cannot be overridden when evaluating a trained checkpoint")
    return cfg


def write_run_meta(output_dir, cfg: RunConfig, command: str, model, data, t0: float, skipped=()) -> None:
    """config.yaml + run_info.json next to an evaluation's or prediction's outputs."""
    import time

    from .utils import now_iso, versions

    save_config(cfg, Path(output_dir) / "config.yaml")
    atomic_write_json(Path(output_dir) / "run_info.json", {
        "command": command, "model": str(model), "data": str(data), "finished": now_iso(),
        "seconds": round(time.time() - t0, 2), "skipped_records": len(skipped), "skipped": list(skipped)[:100],
        "seed": cfg.train.seed, "versions": versions()})


def checkpoint_task(path) -> str:
    """The task (`qa`, `tagging`) of a posbias checkpoint or a Hugging Face task folder."""
    import yaml
    from transformers import AutoConfig

    from .tasks import all_tasks

    path = str(path)
    local_dir(path, "--model")
    if is_posbias_checkpoint(path):
        d = yaml.safe_load((Path(path) / CHECKPOINT_CONFIG).read_text(encoding="utf-8")) or {}
        return d.get("task", "qa")
    try:
        archs = AutoConfig.from_pretrained(path, local_files_only=True).architectures or []
    except (OSError, ValueError) as e:
        raise ConfigError(f"{path} is neither a posbias checkpoint nor a Hugging Face model folder: {e}") from None
    for t in all_tasks():
        if any(a.endswith(t.hf_suffix) for a in archs):
            return t.name
    suffixes = " or ".join(f"*{t.hf_suffix}" for t in all_tasks())
    raise ConfigError(f"{path}: config.json architectures {archs} has no {suffixes} model")


def evaluate_file(model, data, output_dir, overrides, task: str, evaluate, progress: bool = True) -> dict:
    """`posbias evaluate`: load a checkpoint, read `data` with its config (+ overrides), run
    `evaluate(net, tokenizer, cfg, dataset, output_dir, progress=...)`, write the run's config,
    seed and versions next to the outputs."""
    import time

    from .tasks import get_task

    net, tokenizer, mcfg = load_checkpoint(model, task=task)
    cfg = eval_config(mcfg, overrides)
    ds = get_task(task).read(data, cfg)
    if cfg.data.max_eval_examples:
        ds.examples = ds.examples[: cfg.data.max_eval_examples]
    t0 = time.time()
    result = evaluate(net, tokenizer, cfg, ds, output_dir, progress=progress)
    if output_dir is not None:
        write_run_meta(output_dir, cfg, "evaluate", model, ds.path, t0, skipped=ds.skipped)
    return result
