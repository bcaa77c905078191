"""Encoder (any local Hugging Face checkpoint, or one built from a config) + a registered span head.

Shape legend: b batch, s sequence, d hidden.
"""
from __future__ import annotations

import contextlib
import inspect
import json
import os
import warnings
from pathlib import Path

import torch
from torch import nn

from .config import ModelConfig, RunConfig, load_config, resolve_path
from .errors import ConfigError
from . import heads as _heads  # noqa: F401  (registers the built-in heads)
from .registry import HEADS

# posbias never downloads: every from_pretrained below reads local files only.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

CHECKPOINT_CONFIG = "posbias.yaml"
WEIGHTS = "model.safetensors"


@contextlib.contextmanager
def quiet_transformers():
    """Silence transformers' per-load report table and "Loading weights" bar.

    transformers 5 prints both for every `from_pretrained`, e.g. a table flagging the pooler that
    posbias drops on purpose; `build_model` reports the weights that really matter (missing ones).
    """
    from transformers.utils import logging as hf_logging

    level, bar = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)
        if bar:
            hf_logging.enable_progress_bar()


def _from_pretrained(auto_cls, path: str, key: str, **kwargs):
    """`auto_cls.from_pretrained` from a local folder, quietly; weights the folder lacks (other than a
    pooler posbias never uses) are named in one warning instead of transformers' report table."""
    with warnings.catch_warnings(), quiet_transformers():
        warnings.simplefilter("ignore")
        model, info = auto_cls.from_pretrained(path, local_files_only=True, output_loading_info=True, **kwargs)
    missing = sorted(k for k in info.get("missing_keys", ()) if "pooler" not in k)
    if missing:  # not (all of) a trained model: say so, once
        warnings.warn(f"{key}: {len(missing)} weight(s) are not in {path} and start random: "
                      f"{', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}", stacklevel=3)
    return model


def _local_dir(path: str, key: str) -> str:
    if not Path(path).is_dir():
        raise ConfigError(f"{key}: {path!r} is not a local folder (posbias never downloads models; "
                          "use `minilm` for the bundled MiniLM or a folder with config.json)")
    return path


def load_tokenizer(mcfg: ModelConfig):
    from transformers import AutoTokenizer

    from .data.features import check_fast_tokenizer

    spec = mcfg.tokenizer or mcfg.name_or_path
    if not spec:
        raise ConfigError("model.tokenizer must be set when the encoder is built from model.encoder")
    path = _local_dir(resolve_path(spec), "model.tokenizer" if mcfg.tokenizer else "model.name_or_path")
    try:
        tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError) as e:
        raise ConfigError(f"cannot load a tokenizer from {path}: {e}") from None
    check_fast_tokenizer(tok)
    return tok


def position_id_base(encoder) -> tuple[int, int]:
    """(first position id, id given to padding) — RoBERTa-style models count from padding_idx + 1."""
    pad_idx = getattr(getattr(encoder, "embeddings", None), "padding_idx", None)
    if pad_idx is not None:
        return pad_idx + 1, pad_idx
    return 0, 0


class QAModel(nn.Module):
    """encoder + head; `forward(batch, targets=None)` returns scores, and the loss given targets."""

    def __init__(self, encoder: nn.Module, head: nn.Module, head_name: str, null_answer: bool):
        super().__init__()
        self.encoder = encoder
        self.head = head
        self.head_name = head_name
        self.null_answer = null_answer
        params = inspect.signature(encoder.forward).parameters
        self._takes_positions = "position_ids" in params
        self._takes_types = "token_type_ids" in params
        self.position_base, self.position_pad = position_id_base(encoder)

    def position_ids(self, attention_mask: torch.Tensor) -> torch.Tensor:
        """(b, s) positions counted over real tokens only, so left padding does not shift them."""
        pos = attention_mask.long().cumsum(-1) - 1 + self.position_base
        return pos.masked_fill(attention_mask == 0, self.position_pad)

    def encode(self, batch: dict) -> torch.Tensor:
        kwargs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
        if self._takes_types and "token_type_ids" in batch:
            kwargs["token_type_ids"] = batch["token_type_ids"]
        if self._takes_positions:
            # A perturbation (training only) may have set shifted position ids already.
            pos = batch.get("position_ids")
            kwargs["position_ids"] = pos if pos is not None else self.position_ids(batch["attention_mask"])
        return self.encoder(**kwargs).last_hidden_state  # (b, s, d)

    def forward(self, batch: dict, targets: dict | None = None) -> dict:
        return self.head(self.encode(batch), batch, targets)


def build_model(mcfg: ModelConfig, tokenizer, null_answer: bool) -> QAModel:
    """A fresh model for training: pretrained encoder weights (or random from `model.encoder`)."""
    from transformers import AutoConfig, AutoModel

    if mcfg.name_or_path:
        path = _local_dir(resolve_path(mcfg.name_or_path), "model.name_or_path")
        try:
            try:
                encoder = _from_pretrained(AutoModel, path, "model.name_or_path", add_pooling_layer=False)
            except TypeError:  # an encoder class without a pooler option
                encoder = _from_pretrained(AutoModel, path, "model.name_or_path")
        except (OSError, ValueError) as e:
            raise ConfigError(f"model.name_or_path: cannot load an encoder from {path}: {e}") from None
    else:
        spec = dict(mcfg.encoder)
        spec.setdefault("vocab_size", len(tokenizer))
        spec.setdefault("pad_token_id", tokenizer.pad_token_id)
        model_type = spec.pop("model_type")
        try:
            config = AutoConfig.for_model(model_type, **spec)
        except (ValueError, KeyError) as e:
            raise ConfigError(f"model.encoder: {e}") from None
        encoder = _encoder_from_config(config)
    head = make_head(mcfg.head, encoder.config.hidden_size, null_answer, mcfg.head_options)
    return QAModel(encoder, head, mcfg.head, null_answer)


def make_head(name: str, hidden_size: int, null_answer: bool, options: dict):
    factory = HEADS.get(name, "model.head")
    try:
        return factory(hidden_size, null_answer=null_answer, **options)
    except TypeError as e:  # an option the head does not take
        raise ConfigError(f"model.head_options for head {name!r}: {e}") from None


def _encoder_from_config(config):
    from transformers import AutoModel

    try:
        return AutoModel.from_config(config, add_pooling_layer=False)
    except TypeError:
        return AutoModel.from_config(config)


def save_checkpoint(model: QAModel, cfg: RunConfig, tokenizer, out_dir, extra: dict | None = None) -> None:
    """Write a self-contained checkpoint: safetensors weights, encoder config, tokenizer, run config."""
    from safetensors.torch import save_file

    from .config import save_config
    from .utils import atomic_write_json

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    save_file(state, str(out / WEIGHTS), metadata={"format": "pt", "posbias_head": model.head_name})
    model.encoder.config.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    save_config(cfg, out / CHECKPOINT_CONFIG)
    atomic_write_json(out / "posbias_model.json", {"head": model.head_name, "null_answer": model.null_answer,
                                                   **(extra or {})})


def is_posbias_checkpoint(path) -> bool:
    return (Path(path) / CHECKPOINT_CONFIG).is_file() and (Path(path) / WEIGHTS).is_file()


def load_checkpoint(path, map_location="cpu") -> tuple[QAModel, object, RunConfig]:
    """Load a posbias checkpoint or a Hugging Face AutoModelForQuestionAnswering folder.

    Returns (model, tokenizer, run config). A HF QA folder becomes an `independent` head whose
    weights are the folder's `qa_outputs`, so any extractive QA checkpoint can be evaluated here.
    """
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoTokenizer

    path = str(path)
    _local_dir(path, "checkpoint")
    if not is_posbias_checkpoint(path):
        return _load_hf_qa(path)
    cfg = load_config(Path(path) / CHECKPOINT_CONFIG)
    meta = json.loads((Path(path) / "posbias_model.json").read_text(encoding="utf-8"))
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    encoder = _encoder_from_config(AutoConfig.from_pretrained(path, local_files_only=True))
    head = make_head(meta["head"], encoder.config.hidden_size, meta["null_answer"], cfg.model.head_options)
    model = QAModel(encoder, head, meta["head"], meta["null_answer"])
    model.load_state_dict(load_file(str(Path(path) / WEIGHTS), device=str(map_location)))
    return model, tokenizer, cfg


def _load_hf_qa(path: str):
    from transformers import AutoConfig, AutoModelForQuestionAnswering, AutoTokenizer

    from .config import build_config

    try:
        config = AutoConfig.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError) as e:
        raise ConfigError(f"{path} is neither a posbias checkpoint nor a Hugging Face model folder: {e}") from None
    archs = config.architectures or []
    if not any(a.endswith("ForQuestionAnswering") for a in archs):
        raise ConfigError(f"{path}: config.json architectures {archs} has no *ForQuestionAnswering model; "
                          "to train from a bare encoder use `posbias train qa` with model.name_or_path")
    hf = _from_pretrained(AutoModelForQuestionAnswering, path, "checkpoint")
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    if not hasattr(hf, "qa_outputs"):
        raise ConfigError(f"{path}: {type(hf).__name__} has no qa_outputs layer (only start/end-vector "
                          "QA models can be imported)")
    encoder = getattr(hf, hf.base_model_prefix)
    head = HEADS.get("independent")(config.hidden_size, null_answer=True)
    head.qa_outputs.load_state_dict(hf.qa_outputs.state_dict())
    cfg = build_config({"model": {"name_or_path": path, "head": "independent"}})
    return QAModel(encoder, head, "independent", True), tokenizer, cfg


def export_hf(checkpoint, out_dir) -> Path:
    """Turn a posbias checkpoint with the `independent` head into an AutoModelForQuestionAnswering folder."""
    from transformers import AutoModelForQuestionAnswering

    model, tokenizer, _ = load_checkpoint(checkpoint)
    if model.head_name != "independent":
        raise ConfigError(f"{checkpoint}: head {model.head_name!r} has no Hugging Face equivalent; "
                          "only the `independent` head can be exported")
    config = model.encoder.config
    config.architectures = None
    hf = AutoModelForQuestionAnswering.from_config(config)
    base = getattr(hf, hf.base_model_prefix)
    missing, unexpected = base.load_state_dict(model.encoder.state_dict(), strict=False)
    # Only a pooler the QA model does not use may be missing.
    if unexpected or any("pooler" not in k for k in missing):
        raise ConfigError(f"cannot map encoder weights onto {type(hf).__name__}: missing {missing}, "
                          f"unexpected {unexpected}")
    hf.qa_outputs.load_state_dict(model.head.qa_outputs.state_dict())
    out = Path(out_dir)
    hf.save_pretrained(str(out), safe_serialization=True)
    tokenizer.save_pretrained(str(out))
    return out
