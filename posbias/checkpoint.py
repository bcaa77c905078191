"""Checkpoints, for every task: one folder with safetensors weights, the encoder's config.json, the
tokenizer, the run config (posbias.yaml) and the task model's own metadata (posbias_model.json).

`load_checkpoint` also opens Hugging Face `*ForQuestionAnswering` / `*ForTokenClassification`
folders, so models trained elsewhere can be evaluated and diagnosed here. This module reads and
writes the folder; evaluating what it holds (a config with overrides, precision, the outputs of
`posbias evaluate`) is `posbias.evaluation`.
"""
from __future__ import annotations

from pathlib import Path

from .config import RunConfig, build_config, load_config, save_config
from .encoders import (WEIGHTS, check_vocab_fits, check_weights_file, first_shape_error, local_dir,
                       weight_shapes)
from .errors import ConfigError
from .limits import load_json
from .registry import TASKS
from .utils import atomic_write_json, save_safetensors

CHECKPOINT_CONFIG = "posbias.yaml"
MODEL_META = "posbias_model.json"
ENCODER_CONFIG = "config.json"
EXPORT_SETTINGS = "posbias.json"
"""Beside an exported Hugging Face folder's config.json: the settings the model was trained and
evaluated with that the folder's weights do not carry (windows, decoding, the label scheme), which
`posbias predict` / `evaluate` / `diagnose` apply to that folder (command-line overrides still win).
Transformers ignores the file."""


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


def write_export_settings(out_dir, cfg: RunConfig, keys: dict[str, tuple[str, ...]], model: dict) -> dict:
    """Write `EXPORT_SETTINGS` into an exported folder: the run config's `keys` (section -> key names)
    and the task model's own facts (`model`); returns what was written."""
    d = cfg.to_dict()
    settings = {"task": cfg.task, **{section: {k: d[section][k] for k in names} for section, names in keys.items()},
                "model": model}
    atomic_write_json(Path(out_dir) / EXPORT_SETTINGS, settings)
    return settings


def read_export_settings(path, task: str) -> dict:
    """The `EXPORT_SETTINGS` of a Hugging Face folder posbias exported ({} for any other folder);
    a file that is not an object, or that names another task, is refused naming the file."""
    file = Path(path) / EXPORT_SETTINGS
    if not file.is_file():
        return {}
    settings = load_json(file, "export settings")
    if not isinstance(settings, dict) or settings.get("task") != task:
        raise ConfigError(f"{file}: not the settings of an exported {task} model (an object with \"task\": "
                          f"\"{task}\"); remove it to load the folder with posbias's defaults")
    model = settings.get("model", {})
    if not isinstance(model, dict):
        raise ConfigError(f"{file}: model must be an object, got {model!r}")
    return settings


def export_config(path, task: str, settings: dict, sections: tuple[str, ...], model: dict | None = None) -> RunConfig:
    """The run config of a Hugging Face folder: posbias's defaults (`model`: more model keys), under
    the `sections` of its export settings (`read_export_settings`); a bad key or value is one error
    naming the file."""
    d = {"task": task, "model": {"name_or_path": str(path), **(model or {})}}
    d.update({k: settings[k] for k in sections if isinstance(settings.get(k), dict)})
    try:
        return build_config(d)
    except ConfigError as e:
        raise ConfigError(f"{Path(path) / EXPORT_SETTINGS}: {one_line(e)}") from None


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
