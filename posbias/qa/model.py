"""QA model: an encoder (any local Hugging Face checkpoint, or one built from a config) + a
registered span head; loading of Hugging Face QA folders; export to AutoModelForQuestionAnswering.

Shape legend: b batch, s sequence, d hidden.
"""
from __future__ import annotations

import inspect
from pathlib import Path

import numpy as np
import torch
from torch import nn

from .. import factories
from ..checkpoint import (EXPORT_SETTINGS, MODEL_META, export_config, load_checkpoint, read_export_settings,
                          write_export_settings)
from ..config import ModelConfig
from ..encoders import (
    EncoderInputs,
    check_vocab_fits,
    encoder_from_config,
    from_pretrained_quietly,
    hf_prediction_head,
    hf_task_model,
    load_encoder,
    open_tokenizer,
    quiet_transformers,
)
from ..errors import ConfigError
from ..parity import check_forwards, check_parity
from ..precision import full_precision, to_float
from ..registry import HEADS
from . import bidaf as _bidaf, heads as _heads  # noqa: F401  (register the BiDAF encoder type, the built-in heads)
from .collate import collate
from .debias import AnswerPrior, head_mask, make_debias
from .examples import QAExample
from .features import build_qa_features
from .heads.span_scores import candidate_mask


class QAModel(nn.Module):
    """encoder + head; `forward(batch, targets=None)` returns scores, and the loss given targets.

    `debias` (`posbias.qa.debias.Debias`, from `train.debias`) replaces the head's loss in training;
    the scores, and so every prediction, are the head's alone. `prediction_head`: a Hugging Face
    task model's own module between its encoder and its span layer (ModernBERT's dense + GELU +
    LayerNorm `head`), for imported folders only; posbias's own models have none (no state_dict key)."""

    def __init__(self, encoder: nn.Module, head: nn.Module, head_name: str, null_answer: bool,
                 debias: nn.Module | None = None, prediction_head: nn.Module | None = None):
        super().__init__()
        self.encoder = encoder
        self.prediction_head = prediction_head
        self.head = head
        self.head_name = head_name
        self.null_answer = null_answer
        self.debias = debias
        self._inputs = EncoderInputs(encoder)
        self.position_base, self.position_pad = self._inputs.base, self._inputs.pad
        # Positions a head puts before the tokens (DyReF's queries): the tokens' ids move by this much.
        self.position_offset = getattr(head, "position_offset", 0)

    def position_ids(self, attention_mask):
        """(b, s) positions counted over real tokens only, so left padding does not shift them."""
        from ..encoders import position_ids  # a name clash: this function is position_ids too

        return position_ids(attention_mask, self.position_base, self.position_pad)

    def encoder_position_ids(self, batch: dict):
        """((b, S) position ids, (b, S) bool mask of real slots) of what the encoder is given for this
        batch: a head that puts slots before the tokens (DyReF's queries) reports them and the
        tokens' moved ids; otherwise the batch's (perturbed) ids or the default numbering, with the
        attention mask. What the position-update counter counts."""
        mask = batch["attention_mask"]
        if hasattr(self.head, "encoder_position_ids"):
            offset = mask.new_ones(mask.shape[0], self.position_offset)  # (b, offset): always real
            return self.head.encoder_position_ids(self._inputs, batch), torch.cat([offset, mask], 1).bool()
        pos = batch.get("position_ids")
        return (pos if pos is not None else self.position_ids(mask)), mask.bool()

    def encode(self, batch: dict):
        """(b, s, d) token states; a head with its own `encode` (DyReF) runs the encoder itself and
        gets back whatever it returns."""
        if hasattr(self.head, "encode"):
            return self.head.encode(self.encoder, self._inputs, batch)
        hidden = self._inputs(self.encoder, batch)  # (b, s, d)
        return hidden if self.prediction_head is None else self.prediction_head(hidden)  # (b, s, d)

    def forward(self, batch: dict, targets: dict | None = None) -> dict:
        encoded = self.encode(batch)
        # Under autocast (bf16/fp16) only the encoder runs in low precision: the head's scores,
        # masks, softmaxes and loss are fp32 (`posbias.precision`).
        with full_precision(batch["input_ids"]):
            encoded = to_float(encoded)
            out = self.head(encoded, batch, targets)
            if targets is not None and self.debias is not None:
                out["loss"] = self._debiased_loss(out, encoded, batch, targets)
            return out

    def _debiased_loss(self, out: dict, encoded, batch: dict, targets: dict) -> torch.Tensor:
        """`train.debias`'s loss; `out`'s scores are left as the head made them (decoding reads them)."""
        tokens = encoded["tokens"] if isinstance(encoded, dict) else encoded  # (b, s, d); DyReF: a dict
        words = None
        if self.debias.needs_word_embeddings:
            words = to_float(self.encoder.get_input_embeddings()(batch["input_ids"]))  # (b, s, d)
        return self.debias.loss(out, tokens, batch, targets, head_mask(self.head, batch), words)

    def training_stats(self) -> dict:
        """Scalars of the training objective since the last call (`posbias.training` logs them with
        the loss): the learned-mixin gate's, with `train.debias`; {} otherwise."""
        return self.debias.training_stats() if self.debias is not None else {}

    def meta(self) -> dict:
        """What a checkpoint needs, besides the config, to rebuild this model; with `train.debias`,
        also its method and answer prior (a record of the run: predictions never read it)."""
        meta = {"head": self.head_name, "null_answer": self.null_answer}
        if self.debias is not None:
            prior = self.debias.prior
            meta["debias"] = {"method": self.debias.method, "prior": prior.to_dict() if prior is not None else None}
        return meta


def build_model(mcfg: ModelConfig, tokenizer, null_answer: bool, *, debias=None, prior=None) -> QAModel:
    """A fresh model for training: pretrained encoder weights (or random from `model.encoder`).

    `debias`: the run's `train.debias` (None: off); `prior`: its `AnswerPrior`, from the training
    features (`QATask.train_features`)."""
    encoder = load_encoder(mcfg, tokenizer)
    name = mcfg.head or "independent"
    head = head_for(encoder, name, null_answer, mcfg)
    return QAModel(encoder, head, name, null_answer, debias=debias_for(encoder, name, debias, prior))


def debias_for(encoder, head_name: str, debias, prior=None):
    """The `Debias` module of `train.debias` (None when off), holding `prior` when given."""
    if debias is None:
        return None

    module = make_debias(debias, head_name, encoder)
    if prior is not None:
        module.set_prior(prior)
    return module


def head_for(encoder, name: str, null_answer: bool, mcfg: ModelConfig):
    """The head `name` for this encoder, with the options of the model section `mcfg`."""
    embeddings = encoder.get_input_embeddings()
    return make_head(name, encoder.config.hidden_size, null_answer, mcfg.head_options,
                     embedding_size=getattr(embeddings, "embedding_dim", None),
                     softmax_over_default=getattr(mcfg, "softmax_over_default", None))


def make_head(name: str, hidden_size: int, null_answer: bool, options: dict, *,
              embedding_size: int | None = None, softmax_over_default: str | None = None):
    """A head from its registered factory (`posbias.factories.build`: options checked by name and
    type). posbias fills in `hidden_size`, `null_answer` and, for a factory that takes it,
    `embedding_size`, the width of the encoder's input embeddings (DyReF's queries enter there;
    ALBERT and ELECTRA-small embed narrower than their hidden size); one that takes `softmax_over`
    and is not given it gets `softmax_over_default` (`model.softmax_over_default`) when that is set."""
    factory = HEADS.get(name, "model.head")
    options = dict(options)
    if "softmax_over" in factories.parameters(factory) and softmax_over_default is not None:
        options.setdefault("softmax_over", softmax_over_default)
    filled = {"hidden_size": hidden_size, "null_answer": null_answer, "embedding_size": embedding_size}
    return factories.build(factory, options, key="model.head_options", what=f"head {name!r}", filled=filled)


def head_option_names(factory) -> list[str]:
    """The options a head factory takes (`posbias.factories.option_names`)."""
    return factories.option_names(factory, HEAD_FILLED)


# Keyword arguments posbias fills in itself; they are never head options.
HEAD_FILLED = ("hidden_size", "null_answer", "embedding_size")


def head_softmax_default(name: str | None) -> str | None:
    """The `softmax_over` a head uses when no config sets it, its factory's default (`dynamic_query`:
    `all`, DyReF Eq. 1; `independent`: `context`, Random Padding Eq. 1-2); None for heads without
    the option (VCP and MaP normalise over the context)."""
    default = factories.option_default(HEADS.get(name or "independent", "model.head"), "softmax_over")
    return None if default is inspect.Parameter.empty else default


def model_from_checkpoint(path: str, cfg, meta: dict):
    """(model with random weights, tokenizer) shaped as the posbias checkpoint in `path`.

    A checkpoint trained with `train.debias` gets its gate back (its weights are in the checkpoint)
    and the saved answer prior, so that the model is the one that trained; neither is read by
    predictions."""
    from transformers import AutoConfig

    tokenizer = open_tokenizer(path, as_saved=True)
    encoder = encoder_from_config(AutoConfig.from_pretrained(path, local_files_only=True, trust_remote_code=False))
    debias, prior = getattr(cfg.train, "debias", None), None
    saved = (meta.get("debias") or {}).get("prior")
    if debias is not None and saved is not None:
        prior = AnswerPrior.from_dict(saved, f"{Path(path) / MODEL_META}: debias.prior")
    return QAModel(encoder, head_for(encoder, meta["head"], meta["null_answer"], cfg.model),
                   meta["head"], meta["null_answer"],
                   debias=debias_for(encoder, meta["head"], debias, prior)), tokenizer


def load_hf_qa(path: str, config):
    """A Hugging Face AutoModelForQuestionAnswering folder as (QAModel, tokenizer, run config).

    It becomes an `independent` head whose weights are the folder's start/end layer (`qa_outputs`,
    or ModernBERT's two-output `classifier` after its `head`, which the model carries as its
    `prediction_head`), so any start/end-vector QA checkpoint can be evaluated here. A few check
    inputs must give the folder's own logits (`check_hf_parity`); else the folder is refused.
    """
    from transformers import AutoModelForQuestionAnswering

    hf = from_pretrained_quietly(AutoModelForQuestionAnswering, path, "checkpoint")
    tokenizer = open_tokenizer(path)
    span_layer = span_layer_of(hf)
    if span_layer is None:
        raise ConfigError(f"{path}: {type(hf).__name__} has no qa_outputs layer nor a two-output linear classifier "
                          "(only start/end-vector QA models can be imported)")
    encoder = getattr(hf, hf.base_model_prefix)
    # A folder posbias exported says how its model reads and answers (`export_hf`); others get the defaults.
    settings = read_export_settings(path, "qa")
    null_answer = settings.get("model", {}).get("null_answer", True)
    if not isinstance(null_answer, bool):
        raise ConfigError(f"{Path(path) / EXPORT_SETTINGS}: model.null_answer must be true or false, "
                          f"got {null_answer!r}")
    head = HEADS.get("independent")(config.hidden_size, null_answer=null_answer)
    head.qa_outputs.load_state_dict(span_layer.state_dict())
    cfg = export_config(path, "qa", settings, ("data", "decode"), {"head": "independent"})
    model = QAModel(encoder, head, "independent", null_answer, prediction_head=hf_prediction_head(hf))
    check_vocab_fits(tokenizer, encoder, path)  # before the check's forwards index the table
    check_hf_parity(model, hf, tokenizer, path)
    return model, tokenizer, cfg


def span_layer_of(hf):
    """The Linear(d, 2) start/end layer of a Hugging Face QA model: `qa_outputs` (BERT and most),
    or a two-output `classifier` (ModernBERT); None when it has neither."""
    for name in ("qa_outputs", "classifier"):
        layer = getattr(hf, name, None)
        if isinstance(layer, nn.Linear) and layer.out_features == 2:
            return layer
    return None


# Check inputs for parity with a Hugging Face QA model: short, of different lengths, so that the
# batch holds padding.
PARITY_EXAMPLES = (
    ("What did Ada write?", "Ada Lovelace wrote the first program for the Analytical Engine in 1843."),
    ("Where is the river?", "The river runs through the old town, past the market and into the sea."),
    ("Who?", "Nobody knows."),
)


def check_hf_parity(model: QAModel, hf, tokenizer, source, *, exporting: bool = False) -> None:
    """Refuse (`posbias.parity.check_parity`) when `model`'s start/end logits differ from the Hugging
    Face QA model `hf`'s on `PARITY_EXAMPLES` (posbias's own windows, right-padded into one batch),
    at the positions posbias scores: the context tokens, and [CLS] for a model with null answers."""
    examples = [QAExample(f"parity-{i}", q, c) for i, (q, c) in enumerate(PARITY_EXAMPLES)]
    features = build_qa_features(examples, tokenizer, max_seq_len=64, stride=16, train=False,
                                 source="parity check")
    # Right padding: HF's default position ids (0, 1, ... from the first slot) then equal posbias's.
    batch = collate(features, np.arange(len(features)), pad_id=tokenizer.pad_token_id, padding_side="right")
    kwargs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
    if "token_type_ids" in batch and "token_type_ids" in inspect.signature(hf.forward).parameters:
        kwargs["token_type_ids"] = batch["token_type_ids"]
    scored = candidate_mask(batch["span_mask"], batch["cls_index"], model.null_answer)  # (b, s) context (+ [CLS])
    with check_forwards(source, model, hf):
        ours, theirs = model(batch), hf(**kwargs)
    check_parity(source, hf, [(ours["start_logits"][scored], theirs.start_logits[scored]),
                              (ours["end_logits"][scored], theirs.end_logits[scored])], exporting=exporting)


EXPORTED_KEYS = {"data": ("max_seq_len", "stride", "max_query_len", "context_first"),
                 "decode": ("n_best", "max_answer_len", "null_threshold", "require_max_context")}
"""The run config keys an exported folder carries (`posbias.checkpoint.EXPORT_SETTINGS`): how the
model's windows are cut and its answers decoded."""


def export_hf(checkpoint, out_dir):
    """Turn a posbias checkpoint with the `independent` head into an AutoModelForQuestionAnswering folder.

    Its windows and decoding (`EXPORTED_KEYS`) and whether it answers "no answer" go into
    posbias.json, which `posbias predict` / `evaluate` / `diagnose` apply to the folder, and into
    config.json's `task_specific_params["question-answering"]` under the names of transformers'
    question-answering pipeline (max_seq_len, doc_stride, max_question_len, max_answer_len,
    handle_impossible_answer), for a user's own code."""
    from transformers import AutoModelForQuestionAnswering

    model, tokenizer, cfg = load_checkpoint(checkpoint, task="qa")
    if model.head_name != "independent":
        raise ConfigError(f"{checkpoint}: head {model.head_name!r} has no Hugging Face equivalent; "
                          "only the `independent` head can be exported")
    hf = hf_task_model(AutoModelForQuestionAnswering, model.encoder, checkpoint)
    if not isinstance(getattr(hf, "qa_outputs", None), nn.Linear):
        raise ConfigError(f"{checkpoint}: {type(hf).__name__} has no qa_outputs layer to take the `independent` "
                          "head; it cannot be exported (evaluate it with posbias instead)")
    hf.qa_outputs.load_state_dict(model.head.qa_outputs.state_dict())
    check_hf_parity(model, hf, tokenizer, checkpoint, exporting=True)
    d, dec = cfg.data, cfg.decode
    hf.config.task_specific_params = {"question-answering": {
        "max_seq_len": d.max_seq_len, "doc_stride": d.stride, "max_question_len": d.max_query_len,
        "max_answer_len": dec.max_answer_len, "handle_impossible_answer": model.null_answer}}
    out = Path(out_dir)
    with quiet_transformers():  # no "Writing model shards" bar
        hf.save_pretrained(str(out), safe_serialization=True)
    tokenizer.save_pretrained(str(out))
    write_export_settings(out, cfg, EXPORTED_KEYS, {"null_answer": model.null_answer})
    return out
