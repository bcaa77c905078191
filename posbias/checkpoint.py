"""Checkpoints, for every task: one folder with safetensors weights, the encoder's config.json, the
tokenizer, the run config (posbias.yaml) and the task model's own metadata (posbias_model.json).

`load_checkpoint` also opens Hugging Face `*ForQuestionAnswering` / `*ForTokenClassification`
folders, so models trained elsewhere can be evaluated and diagnosed here.
"""
from __future__ import annotations

import contextlib
import shutil
from pathlib import Path

from . import outputs
from .config import RunConfig, load_config, save_config
from .encoders import WEIGHTS, local_dir
from .errors import ConfigError
from .limits import load_json
from .registry import TASKS
from .utils import atomic_write_json, replace_dir, save_safetensors

CHECKPOINT_CONFIG = "posbias.yaml"
MODEL_META = "posbias_model.json"
ENCODER_CONFIG = "config.json"


def save_checkpoint(model, cfg: RunConfig, tokenizer, out_dir, extra: dict | None = None) -> None:
    """Write a self-contained checkpoint of a task model (any object with `encoder`, `head_name`
    and `meta()`, the JSON-able facts needed to rebuild it, e.g. its label list)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    save_safetensors(state, out / WEIGHTS, metadata={"format": "pt", "posbias_head": model.head_name})
    model.encoder.config.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    save_config(cfg, out / CHECKPOINT_CONFIG)
    atomic_write_json(out / MODEL_META, {**model.meta(), **(extra or {})})


def is_posbias_checkpoint(path) -> bool:
    """A folder save_checkpoint wrote (complete or not: `read_posbias_files` names what is missing)."""
    return any((Path(path) / f).is_file() for f in (CHECKPOINT_CONFIG, MODEL_META))


def one_line(e) -> str:
    return " ".join(str(e).split())


def read_posbias_files(path) -> tuple[RunConfig, dict]:
    """(run config, model metadata) of a posbias checkpoint, after checking that all its files are
    there; any problem is one error naming the file."""
    root = Path(path)
    for f in (CHECKPOINT_CONFIG, MODEL_META, ENCODER_CONFIG, WEIGHTS):
        if not (root / f).is_file():
            raise ConfigError(f"{root / f} is missing: {path} is an incomplete posbias checkpoint")
    try:
        cfg = load_config(root / CHECKPOINT_CONFIG, saved=True)
    except ConfigError as e:  # name the file once, on one line
        msg, file = one_line(e), str(root / CHECKPOINT_CONFIG)
        raise ConfigError(msg if file in msg else f"{file}: {msg}") from None
    meta = load_json(root / MODEL_META, "model metadata")
    if not isinstance(meta, dict):
        raise ConfigError(f"{root / MODEL_META}: top level must be an object")
    return cfg, meta


def read_encoder_config(path):
    """The transformers config of a model folder; a missing or unreadable config.json is named."""
    from transformers import AutoConfig

    file = Path(path) / ENCODER_CONFIG
    if not file.is_file():
        raise ConfigError(f"{path} is neither a posbias checkpoint ({CHECKPOINT_CONFIG}) nor a Hugging Face "
                          f"model folder: {file} is missing")
    try:
        return AutoConfig.from_pretrained(str(path), local_files_only=True, trust_remote_code=False)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ConfigError(f"{file}: {one_line(e)}") from None


def load_checkpoint(path, map_location="cpu", task: str | None = None):
    """(model, tokenizer, run config) of a posbias checkpoint or a Hugging Face task folder.

    Before any weight is read, the folder's files are checked to belong together: tokenizer files
    present and within the embedding table, config.json readable, every tensor of the weights file
    (from its header) named and shaped as config.json and posbias_model.json describe.

    Args:
        task: the task the caller expects (`qa`, `tagging`); a checkpoint of another task is an error.
    """
    from safetensors.torch import load_file

    from .encoders import check_vocab_fits, check_weights_file, first_shape_error, weight_shapes

    path = str(path)
    path = local_dir(path, "checkpoint")
    if is_posbias_checkpoint(path):
        cfg, meta = read_posbias_files(path)
        if task is not None and cfg.task != task:
            raise ConfigError(f"{path} is a {cfg.task} checkpoint, not a {task} one")
        read_encoder_config(path)  # named errors before the task model reads it
        try:
            model, tokenizer = TASKS.get(cfg.task).load_model(path, cfg, meta)
        except KeyError as e:  # a fact the task model needs
            raise ConfigError(f"{Path(path) / MODEL_META}: no {e} entry") from None
        file = Path(path) / WEIGHTS
        wrong = first_shape_error({k: v.shape for k, v in model.state_dict().items()}, weight_shapes(file), file,
                                  f"{ENCODER_CONFIG} and {MODEL_META}")
        if wrong:
            raise ConfigError(wrong)
        check_vocab_fits(tokenizer, model.encoder, path)
        model.load_state_dict(load_file(str(file), device=str(map_location)))
        return model, tokenizer, cfg
    config = read_encoder_config(path)
    archs = config.architectures or []
    tasks = [t for t in TASKS.values() if task in (None, t.name)]
    for t in tasks:
        if any(a.endswith(t.hf_suffix) for a in archs):
            check_weights_file(path)
            model, tokenizer, cfg = t.load_hf(path, config)
            check_vocab_fits(tokenizer, model.encoder, path)
            return model, tokenizer, cfg
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
    d["train"]["device"] = "auto"  # where the model trained says nothing about where it is evaluated
    if "length_quantiles" in d["data"]:  # a tagging run trained on D*: other files are read whole
        d["data"]["length_quantiles"] = None
    cfg = build_config(d, overrides)
    if cfg.model != model_cfg.model:
        raise ConfigError("model.* cannot be overridden when evaluating a trained checkpoint")
    return cfg


def check_max_seq_len(model, cfg: RunConfig) -> None:
    """Refuse a `data.max_seq_len` whose windows would index past the encoder's position table
    (otherwise an IndexError deep inside the encoder). Training calls it on the model it builds,
    evaluation, prediction and diagnosis on the checkpoint they load."""
    n_pos = getattr(model.encoder.config, "max_position_embeddings", None)
    base = getattr(model, "position_base", 0)
    offset = getattr(model, "position_offset", 0)  # positions a head puts before the tokens (DyReF: 2)
    if n_pos is not None and base + cfg.data.max_seq_len + offset > n_pos:
        extra = f" + {offset} positions of model.head {cfg.model.head!r}" if offset else ""
        raise ConfigError(f"data.max_seq_len ({cfg.data.max_seq_len}) + first position id ({base}){extra} "
                          f"exceeds the encoder's max_position_embeddings ({n_pos})")


def load_for_eval(model, overrides, task: str):
    """(net, tokenizer, run config) for evaluating, predicting or diagnosing a checkpoint: its config
    with the overrides (`eval_config`), checked by the same rules as training."""
    from .devices import resolve_device

    net, tokenizer, mcfg = load_checkpoint(model, task=task)
    cfg = eval_config(mcfg, overrides)
    check_max_seq_len(net, cfg)
    device = resolve_device(cfg.train.device)
    return with_precision(net.to(device), eval_precision(cfg, device)), tokenizer, cfg


def eval_precision(cfg: RunConfig, device):
    """The resolved `train.eval_precision` of an evaluation, prediction or diagnosis on `device`."""
    from .precision import resolve_precision

    return resolve_precision(cfg.train.eval_precision, device, "train.eval_precision")


_ANNOUNCED: set = set()


def with_precision(net, precision):
    """`net` whose forward runs under `precision`'s autocast (as accelerate wraps a prepared model's
    forward); fp32 leaves it as it is. A choice other than plain fp32 is printed once per process."""
    import sys

    from .precision import autocast

    if precision.requested not in ("fp32", "no") and precision not in _ANNOUNCED:
        _ANNOUNCED.add(precision)
        print(f"posbias: evaluating in {precision.name} ({precision.reason})", file=sys.stderr, flush=True)
    if precision.name == "fp32":
        return net
    device = next(net.parameters()).device
    net.forward = autocast(device, precision)(net.forward)
    return net


# What evaluate / predict / diagnose write into an output folder. An existing folder holding only
# these (a previous output) is replaced whole; one holding anything else is the user's, and refused.
OUTPUT_NAMES = frozenset({
    "predictions.json", "nbest.json", "null_odds.json", "metrics.json", "predictions.conll", "predictions.jsonl",
    "config.yaml", "run_info.json", "eval", "diagnosis.md", "diagnosis.html", "diagnosis.json",
    "f1_by_position.png", "position_updates.png", "position_curves.png", "per_class.png", "length_density.png",
    "class_positions.png"})


@contextlib.contextmanager
def staged_output(output_dir, names=OUTPUT_NAMES, what: str = "--output-dir"):
    """Yield a fresh `<output_dir>.tmp` folder to write a command's outputs into; when the block
    ends normally it replaces `output_dir` whole (`replace_dir`, as training's `eval/`), so a run
    killed mid-write leaves the previous outputs as they were, never a mix. None yields None.

    `names`: what the command writes. The folder must be new, empty or posbias's own (its marker,
    `outputs.check_ours`) and hold nothing but `names`: anything else is the user's, and refused,
    never replaced. One writer at a time (`outputs.output_lock`), so two evaluations into one folder
    never mix; a result a kill left only in `.tmp`/`.old` is restored first (`outputs.restore`).
    """
    if output_dir is None:
        yield None
        return
    final = Path(output_dir).resolve()  # a symlinked folder: its target is replaced, the link kept
    if final.exists() and not final.is_dir():
        raise ConfigError(f"{output_dir}: the output folder is an existing file; give a folder path")
    if final == Path.cwd().resolve() or final in Path.cwd().resolve().parents:
        raise ConfigError(f"{output_dir}: the output folder holds the working folder; give a new folder")
    with outputs.output_lock(final, what):
        outputs.restore(final, what)
        if final.is_dir():
            foreign = [x for x in outputs.user_entries(final) if x not in names
                       and not (x.startswith(".") and x.endswith(".tmp"))]  # atomic_write leftovers
            if foreign:
                raise ConfigError(f"{output_dir}: the output folder holds {foreign[0]!r}, which posbias did not "
                                  "write; outputs replace the folder whole, so give a new or empty folder")
        outputs.check_ours(final, what)  # only names posbias writes, but not written by posbias
        tmp = final.with_name(final.name + ".tmp")
        try:
            outputs.fresh_dir(tmp, what)  # what a killed run left there goes; a link is refused
        except OSError as e:
            raise ConfigError(f"{output_dir}: cannot create the output folder ({e.strerror or e})") from None
        try:
            yield tmp
            outputs.write_marker(tmp, what)  # last: a marked .tmp is complete (`outputs.restore`)
            replace_dir(tmp, final)
        except BaseException:
            if not tmp.is_symlink():
                shutil.rmtree(tmp, ignore_errors=True)
            raise


def write_run_meta(output_dir, cfg: RunConfig, command: str, model, data, t0: float, skipped=()) -> None:
    """config.yaml + run_info.json next to an evaluation's or prediction's outputs."""
    import time

    from .devices import describe, resolve_device
    from .utils import now_iso, versions

    device = resolve_device(cfg.train.device)
    save_config(cfg, Path(output_dir) / "config.yaml")
    atomic_write_json(Path(output_dir) / "run_info.json", {
        "command": command, "model": str(model), "data": str(data), "finished": now_iso(),
        "seconds": round(time.time() - t0, 2), "skipped_records": len(skipped), "skipped": list(skipped)[:100],
        "seed": cfg.train.seed, "versions": versions(), "hardware": describe(device),
        "precision": eval_precision(cfg, device).to_dict()})


def checkpoint_task(path) -> str:
    """The task (`qa`, `tagging`) of a posbias checkpoint or a Hugging Face task folder."""
    path = str(path)
    path = local_dir(path, "--model")
    if is_posbias_checkpoint(path):
        return read_posbias_files(path)[0].task
    archs = read_encoder_config(path).architectures or []
    for t in TASKS.values():
        if any(a.endswith(t.hf_suffix) for a in archs):
            return t.name
    suffixes = " or ".join(f"*{t.hf_suffix}" for t in TASKS.values())
    raise ConfigError(f"{path}: config.json architectures {archs} has no {suffixes} model")


def evaluate_file(model, data, output_dir, overrides, task: str, evaluate, progress: bool = True) -> dict:
    """`posbias evaluate`: load a checkpoint, read `data` with its config (+ overrides), run
    `evaluate(net, tokenizer, cfg, dataset, output_dir, progress=...)`, write the run's config,
    seed and versions next to the outputs (all through `staged_output`)."""
    import time

    with staged_output(output_dir) as out:
        net, tokenizer, cfg = load_for_eval(model, overrides, task)
        ds = TASKS.get(task).read(data, cfg)
        if cfg.data.max_eval_examples:
            ds.examples = ds.examples[: cfg.data.max_eval_examples]
        t0 = time.time()
        result = evaluate(net, tokenizer, cfg, ds, out, progress=progress)
        if out is not None:
            write_run_meta(out, cfg, "evaluate", model, ds.path, t0, skipped=ds.skipped)
    return result
