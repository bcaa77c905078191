"""QA model: an encoder (any local Hugging Face checkpoint, or one built from a config) + a
registered span head; loading of Hugging Face QA folders; export to AutoModelForQuestionAnswering.

Shape legend: b batch, s sequence, d hidden.
"""
from __future__ import annotations

from torch import nn

from ..config import ModelConfig
from ..encoders import EncoderInputs, encoder_from_config, from_pretrained_quietly, load_encoder, open_tokenizer
from ..errors import ConfigError
from ..registry import HEADS
from . import heads as _heads  # noqa: F401  (registers the built-in heads)


class QAModel(nn.Module):
    """encoder + head; `forward(batch, targets=None)` returns scores, and the loss given targets."""

    def __init__(self, encoder: nn.Module, head: nn.Module, head_name: str, null_answer: bool):
        super().__init__()
        self.encoder = encoder
        self.head = head
        self.head_name = head_name
        self.null_answer = null_answer
        self._inputs = EncoderInputs(encoder)
        self.position_base, self.position_pad = self._inputs.base, self._inputs.pad
        # Positions a head puts before the tokens (DyReF's queries): the tokens' ids move by this much.
        self.position_offset = getattr(head, "position_offset", 0)

    def position_ids(self, attention_mask):
        """(b, s) positions counted over real tokens only, so left padding does not shift them."""
        from ..encoders import position_ids

        return position_ids(attention_mask, self.position_base, self.position_pad)

    def encode(self, batch: dict):
        """(b, s, d) token states; a head with its own `encode` (DyReF) runs the encoder itself and
        gets back whatever it returns."""
        if hasattr(self.head, "encode"):
            return self.head.encode(self.encoder, self._inputs, batch)
        return self._inputs(self.encoder, batch)  # (b, s, d)

    def forward(self, batch: dict, targets: dict | None = None) -> dict:
        return self.head(self.encode(batch), batch, targets)

    def meta(self) -> dict:
        """What a checkpoint needs, besides the config, to rebuild this model."""
        return {"head": self.head_name, "null_answer": self.null_answer}


def build_model(mcfg: ModelConfig, tokenizer, null_answer: bool) -> QAModel:
    """A fresh model for training: pretrained encoder weights (or random from `model.encoder`)."""
    encoder = load_encoder(mcfg, tokenizer)
    name = mcfg.head or "independent"
    head = make_head(name, encoder.config.hidden_size, null_answer, mcfg.head_options)
    return QAModel(encoder, head, name, null_answer)


def make_head(name: str, hidden_size: int, null_answer: bool, options: dict):
    factory = HEADS.get(name, "model.head")
    try:
        return factory(hidden_size, null_answer=null_answer, **options)
    except TypeError as e:  # an option the head does not take
        raise ConfigError(f"model.head_options for head {name!r}: {e}") from None


def model_from_checkpoint(path: str, cfg, meta: dict):
    """(model with random weights, tokenizer) shaped as the posbias checkpoint in `path`."""
    from transformers import AutoConfig

    tokenizer = open_tokenizer(path)
    encoder = encoder_from_config(AutoConfig.from_pretrained(path, local_files_only=True))
    head = make_head(meta["head"], encoder.config.hidden_size, meta["null_answer"], cfg.model.head_options)
    return QAModel(encoder, head, meta["head"], meta["null_answer"]), tokenizer


def load_hf_qa(path: str, config):
    """A Hugging Face AutoModelForQuestionAnswering folder as (QAModel, tokenizer, run config).

    It becomes an `independent` head whose weights are the folder's `qa_outputs`, so any extractive
    QA checkpoint can be evaluated here.
    """
    from transformers import AutoModelForQuestionAnswering

    from ..config import build_config

    hf = from_pretrained_quietly(AutoModelForQuestionAnswering, path, "checkpoint")
    tokenizer = open_tokenizer(path)
    if not hasattr(hf, "qa_outputs"):
        raise ConfigError(f"{path}: {type(hf).__name__} has no qa_outputs layer (only start/end-vector "
                          "QA models can be imported)")
    encoder = getattr(hf, hf.base_model_prefix)
    head = HEADS.get("independent")(config.hidden_size, null_answer=True)
    head.qa_outputs.load_state_dict(hf.qa_outputs.state_dict())
    cfg = build_config({"model": {"name_or_path": path, "head": "independent"}})
    return QAModel(encoder, head, "independent", True), tokenizer, cfg


def export_hf(checkpoint, out_dir):
    """Turn a posbias checkpoint with the `independent` head into an AutoModelForQuestionAnswering folder."""
    from pathlib import Path

    from transformers import AutoModelForQuestionAnswering

    from ..checkpoint import load_checkpoint
    from ..encoders import hf_task_model

    model, tokenizer, _ = load_checkpoint(checkpoint, task="qa")
    if model.head_name != "independent":
        raise ConfigError(f"{checkpoint}: head {model.head_name!r} has no Hugging Face equivalent; "
                          "only the `independent` head can be exported")
    hf = hf_task_model(AutoModelForQuestionAnswering, model.encoder, checkpoint)
    hf.qa_outputs.load_state_dict(model.head.qa_outputs.state_dict())
    out = Path(out_dir)
    hf.save_pretrained(str(out), safe_serialization=True)
    tokenizer.save_pretrained(str(out))
    return out
