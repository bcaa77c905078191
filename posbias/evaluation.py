"""Evaluating a checkpoint, for every task: the orchestration around `posbias.checkpoint`'s files.

`load_for_eval` opens a checkpoint for `posbias evaluate` / `predict` / `diagnose` (its run config
with the command's overrides, `eval_config`; the same checks as training; `train.eval_precision`;
`opened_for_eval`: the same, with torch's current CUDA device the model's for the block),
`evaluate_file` is `posbias evaluate` for any task (a checkpoint, a data file, the task's
evaluation, its outputs), and `write_run_meta` writes config.yaml and run_info.json next to a
command's outputs. The outputs themselves go through `outputs.staged_output`.
"""
from __future__ import annotations

import contextlib
import sys
import time
from dataclasses import replace
from pathlib import Path

from . import devices  # called as devices.resolve_device: the tests' CPU rule replaces it there (tests/devices_under_test.py)
from .checkpoint import check_max_seq_len, load_checkpoint
from .config import RunConfig, build_config, save_config
from .errors import ConfigError
from .outputs import staged_output
from .precision import autocast, resolve_precision
from .registry import HEADS, TASKS
from .utils import atomic_write_json, now_iso, versions


def eval_config(model_cfg: RunConfig, overrides) -> RunConfig:
    """A checkpoint's run config with evaluation overrides (windows, decoding, batch size); the
    model itself may not be overridden, except the head options its head declares decode-time
    (`decoding_changes`). The training run's cap on evaluation examples does not carry
    over: a file given for evaluation is scored whole unless `data.max_eval_examples` (or, tagging,
    `data.length_quantiles`) is overridden."""
    d = model_cfg.to_dict()
    d["data"]["max_eval_examples"] = None
    d["train"]["device"] = "auto"  # where the model trained says nothing about where it is evaluated
    if "length_quantiles" in d["data"]:  # a tagging run trained on D*: other files are read whole
        d["data"]["length_quantiles"] = None
    cfg = build_config(d, overrides)
    decoding_changes(model_cfg, cfg)
    return cfg


def decoding_changes(model_cfg: RunConfig, cfg: RunConfig) -> dict:
    """The head options `cfg` changes from the checkpoint's `model_cfg`: only those its head
    declares decode-time (`HEADS.register(name, decode_options=...)`, options no weight depends on,
    such as MaP's `ensemble`); any other model.* change is refused."""
    a, b = model_cfg.model, cfg.model
    if a == b:
        return {}
    if replace(b, head_options=a.head_options) != a:
        raise ConfigError("model.* cannot be overridden when evaluating a trained checkpoint")
    changed = {k: v for k, v in b.head_options.items() if k not in a.head_options or a.head_options[k] != v}
    try:
        declared = HEADS.traits(a.head, "model.head").get("decode_options", ()) if a.head else ()
    except ConfigError:  # not a registered QA head (tagging's `linear`): nothing to decode differently
        declared = ()
    bad = sorted(set(changed) - set(declared))
    if bad:
        raise ConfigError(f"model.head_options.{bad[0]} cannot be overridden when evaluating a trained checkpoint "
                          f"(head {a.head!r} decodes differently only through {list(declared) or 'no option'})")
    return changed


def load_for_eval(model, overrides, task: str):
    """(net, tokenizer, run config) for evaluating, predicting or diagnosing a checkpoint: its config
    with the overrides (`eval_config`), checked by the same rules as training."""
    net, tokenizer, mcfg = load_checkpoint(model, task=task)
    cfg = eval_config(mcfg, overrides)
    changed = decoding_changes(mcfg, cfg)
    if changed:
        net.head.set_decoding(**changed)
    check_max_seq_len(net, cfg)
    device = devices.resolve_device(cfg.train.device)
    return with_precision(net.to(device), eval_precision(cfg, device)), tokenizer, cfg


@contextlib.contextmanager
def opened_for_eval(model, overrides, task: str):
    """`load_for_eval`'s (net, tokenizer, run config), with torch's current CUDA device the model's
    inside the block (`devices.current`), as training sets it: on `cuda:N`, whatever says only `cuda`
    (a kernel library's handle, a third party's tensor) lands on GPU N, not GPU 0."""
    net, tokenizer, cfg = load_for_eval(model, overrides, task)
    param = next(net.parameters(), None)
    with devices.current(param.device if param is not None else devices.resolve_device(cfg.train.device)):
        yield net, tokenizer, cfg


def eval_precision(cfg: RunConfig, device):
    """The resolved `train.eval_precision` of an evaluation, prediction or diagnosis on `device`."""
    return resolve_precision(cfg.train.eval_precision, device, "train.eval_precision")


_ANNOUNCED: set = set()


def with_precision(net, precision):
    """`net` whose forward runs under `precision`'s autocast (as accelerate wraps a prepared model's
    forward); fp32 leaves it as it is. A choice other than plain fp32 is printed once per process."""
    if precision.requested not in ("fp32", "no") and precision not in _ANNOUNCED:
        _ANNOUNCED.add(precision)
        print(f"posbias: evaluating in {precision.name} ({precision.reason})", file=sys.stderr, flush=True)
    if precision.name == "fp32":
        return net
    device = next(net.parameters()).device
    net.forward = autocast(device, precision)(net.forward)
    return net


def write_run_meta(output_dir, cfg: RunConfig, command: str, model, data, t0: float, skipped=()) -> None:
    """config.yaml + run_info.json next to an evaluation's or prediction's outputs."""
    device = devices.resolve_device(cfg.train.device)
    save_config(cfg, Path(output_dir) / "config.yaml")
    atomic_write_json(Path(output_dir) / "run_info.json", {
        "command": command, "model": str(model), "data": str(data), "finished": now_iso(),
        "seconds": round(time.time() - t0, 2), "skipped_records": len(skipped), "skipped": list(skipped)[:100],
        "seed": cfg.train.seed, "versions": versions(), "hardware": devices.describe(device),
        "precision": eval_precision(cfg, device).to_dict()})


def evaluate_file(model, data, output_dir, overrides, task: str, evaluate, progress: bool = True) -> dict:
    """`posbias evaluate`: load a checkpoint, read `data` with its config (+ overrides), run
    `evaluate(net, tokenizer, cfg, dataset, output_dir, progress=...)`, write the run's config,
    seed and versions next to the outputs (all through `staged_output`)."""
    with staged_output(output_dir) as out, opened_for_eval(model, overrides, task) as (net, tokenizer, cfg):
        ds = TASKS.get(task).read(data, cfg)
        if cfg.data.max_eval_examples:
            ds.examples = ds.examples[: cfg.data.max_eval_examples]
        t0 = time.time()
        result = evaluate(net, tokenizer, cfg, ds, out, progress=progress)
        if out is not None:
            write_run_meta(out, cfg, "evaluate", model, ds.path, t0, skipped=ds.skipped)
    return result
