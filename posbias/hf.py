"""posbias inside a user's own Hugging Face `Trainer` script: data collators and a callback.

A front beside `api.py` and `cli.py`: it calls down into `posbias.perturb` (the same samplers and
concatenation the posbias training loop uses) and the tagging evaluation; nothing below imports it.

Collators wrap the collator a script already has (`DataCollatorForTokenClassification`,
`default_data_collator`, `DataCollatorWithPadding`, ...) and add what a method needs to its batch:

- `PositionShiftCollator(collator, model, tokenizer, method="rpp" | "random_padding" |
  "randomized_positions")`: Random Position Perturbation (Ben Amor et al., §4.1), Random Padding
  (Tao et al., §3) or randomized positional encodings (Ruoss et al., ACL 2023) as a
  `position_ids` tensor, with the position base and table size read off the model, as posbias's
  `bind` does (RoBERTa counts from padding_idx + 1). The batch's own fields pass through untouched.
- `ContextPerturbationCollator(collator, model, tokenizer)`: Context Perturbation (Ben Amor et
  al., §4.2) on a token-classification batch: rows re-packed into concatenations of sentences in
  distinct random orders, `labels` carried along (-100 on the joining separators).
- `PerturbationCollator(collator, model, tokenizer, name, **options)`: any perturbation registered
  in `posbias.registry.PERTURBATIONS` (the built-in ones above, or one of your own, `posbias.
  factories`), by name and with its config options, run exactly as the posbias training loop runs it.

The Trainer collates its evaluation batches with the same collator, so a collator cannot perturb
on its own: it returns the clean batch with the perturbed one beside it under `posbias_view`, and a
forward pre-hook it puts on the model swaps the view in for training forwards (`model.train()`,
which the Trainer sets right before each training step) and drops it otherwise. Evaluation,
prediction and `trainer.evaluate()` thus see clean batches, whatever the order of collation.

`mode="augment"` (the default for RPP and CP) is the authors' recipe (a clean and a perturbed pass, losses summed): the collator
returns both views stacked into one batch of 2b rows, so the Trainer's loss is the mean over both
(the sum of the two losses up to a factor of 2, which AdamW's update does not see).

`PositionBiasCallback` runs the duplicated-test-set evaluation F1(α) (Ben Amor et al., §3) of the
model being trained at every evaluation and adds `<prefix>_f1_alpha_<α>` (POS: accuracy) to the
Trainer's metrics, so they are logged, returned by `trainer.evaluate()` and usable as
`metric_for_best_model`.

Randomness: a collator perturbs each batch with a generator seeded by its `seed`, the batch's
content (its input ids) and how often this collator has collated that content before
(`BatchDraws`). The draw is thus the batch's own, whichever process or DataLoader worker collates
it: a run on N processes perturbs every global batch as a run on one process does (accelerate
gives process r the global batches r, r + N, ...), and workers draw distinct perturbations for
distinct batches. A batch that recurs (the same examples in the same order, as without shuffling)
draws afresh each time the same collator (process, persistent worker) sees it again.

`PositionBiasCallback` under several processes (torchrun, `accelerate launch`): every process
scores the duplicated test sets and takes the first process's numbers, so the metrics are present
and equal on every process (the Trainer's best-model choice reads them on each).
"""
from __future__ import annotations

import hashlib
import inspect
import os
import warnings
from collections import Counter

import numpy as np
import torch

from .tokens import separator_id, special_tokens
from .encoders import position_id_base, position_ids
from .errors import ConfigError
from .perturb import build_perturbation
from .perturb.context_concat import concatenate_contexts
from .perturb.position_shift import (sample_random_padding, sample_randomized_positions, sample_rpp, shift_effect,
                                     shift_position_ids)
from .precision import VALUES, autocast, resolve_precision
from .tagging.config import POSITION_BATCH_TOKENS
from .tagging.duplicated import position_eval, summary
from .tagging.evaluate import align_labels
from .tagging.model import tagger_view
from .tagging.readers import read_tagging

METHODS = ("rpp", "random_padding", "randomized_positions")
MODES = ("replace", "augment")
IGNORE = -100  # the label id Hugging Face losses skip


def _base_model(model):
    return getattr(model, getattr(model, "base_model_prefix", ""), model)


def position_numbering(model) -> tuple[int, int, int | None]:
    """How a Hugging Face model numbers its positions, for the position-shifting collators.

    A model where shifted ids move no word is refused by name, with the config attribute that
    says so (`shift_effect`): relative or rotary positions (DeBERTa, ModernBERT, RoFormer,
    Llama), no position table (BLOOM, XLNet); so is a forward that takes no `position_ids`. One
    that still moves something (DeBERTa's position_biased_input) gets a warning.

    Args:
        model: a Hugging Face model (`AutoModelFor...`).

    Returns:
        (first position id, padding position id, position table size or None). RoBERTa counts
        from padding_idx + 1.

    Raises:
        ConfigError: a model that position shifting cannot act on.
    """
    moves, why = shift_effect(model.config)
    if not moves:
        raise ConfigError(f"{type(model).__name__}: {why}; position shifting (Random Padding, RPP) cannot act on "
                          "it; use an encoder with absolute position embeddings (BERT, RoBERTa, ELECTRA, ...) or "
                          "Context Perturbation")
    if "position_ids" not in inspect.signature(model.forward).parameters:
        raise ConfigError(f"{type(model).__name__}.forward takes no position_ids: position shifting (Random "
                          "Padding, RPP) cannot reach this model; use an encoder with absolute position "
                          "ids (BERT, RoBERTa, ELECTRA, ...) or Context Perturbation")
    if why:
        warnings.warn(f"{type(model).__name__}: {why}", stacklevel=3)
    base, pad = position_id_base(_base_model(model))
    return base, pad, getattr(model.config, "max_position_embeddings", None)


def _leading_special(tokenizer) -> set[int]:
    prefix, _ = special_tokens(tokenizer)
    return {prefix[0]} if prefix else set()


def _cls_index(input_ids: torch.Tensor, attention_mask: torch.Tensor, leading: set[int]) -> torch.Tensor:
    """(b,) index of each row's leading special token ([CLS], <s>), -1 where the row has none."""
    first = attention_mask.long().argmax(-1)  # (b,) first real token (left padding included)
    rows = torch.arange(input_ids.shape[0])
    starts = input_ids[rows, first]  # (b,)
    has = torch.tensor([int(t) in leading for t in starts.tolist()], dtype=torch.bool)
    return torch.where(has, first, torch.full_like(first, -1))


def _word_fields(mask: torch.Tensor, labels: torch.Tensor, n_prefix: int, n_suffix: int) -> dict:
    """The fields Context Perturbation carries along, for a token-classification batch: each row's
    body (its real tokens without the tokenizer's own prefix/suffix specials) as `word_index` 0, -1
    elsewhere; `predict` where a label is; the leading special's index (-1 without one); the left
    padding and the row index."""
    b, s = mask.shape
    first = mask.long().argmax(-1)  # (b,) first real token
    lens = mask.sum(-1)  # (b,)
    slots = torch.arange(s)[None]  # (1, s)
    body = (slots >= (first + n_prefix)[:, None]) & (slots < (first + lens - n_suffix)[:, None])
    return {"word_index": torch.where(body, 0, -1), "predict": labels != IGNORE,
            "cls_index": first if n_prefix else torch.full((b,), -1, dtype=torch.long),
            "pad_left": first, "window": torch.arange(b)}


VIEW = "posbias_view"


class BatchDraws:
    """The generator a collator perturbs a batch with (module doc, Randomness): keyed on the seed,
    the batch's content and its recurrence count on this collator, never on the process or on how
    many batches came before, so that 1 and N processes (or DataLoader workers) draw the same for
    the same batch. Calling it with a batch (a dict with `input_ids`) returns a seeded
    `torch.Generator`.

    Args:
        seed: the collator's seed.
    """

    def __init__(self, seed: int):
        self.seed = seed
        self.seen: Counter = Counter()  # content digest -> batches of that content drawn for so far

    def __call__(self, batch: dict) -> torch.Generator:
        ids = batch["input_ids"]
        digest = hashlib.blake2b(str(tuple(ids.shape)).encode(), digest_size=16)
        digest.update(np.ascontiguousarray(ids.cpu().numpy(), dtype=np.int64).tobytes())
        key = digest.digest()
        again = self.seen[key]
        self.seen[key] += 1
        words = np.frombuffer(key, dtype=np.uint32).tolist()
        state = np.random.SeedSequence([self.seed, again, *words]).generate_state(2, np.uint32)
        return torch.Generator().manual_seed(int(state[0]) << 32 | int(state[1]))


def _swap_in_view(module, args, kwargs):
    """Forward pre-hook: the collated perturbed view replaces the batch in training forwards only."""
    view = kwargs.pop(VIEW, None)
    if view is not None and module.training:
        kwargs.update(view)
    return args, kwargs


def _install_hook(model) -> None:
    if not getattr(model, "_posbias_view_hook", False):
        model.register_forward_pre_hook(_swap_in_view, with_kwargs=True)
        model._posbias_view_hook = True


def _check_mode(mode: str) -> str:
    if mode not in MODES:
        raise ConfigError(f"mode must be one of {list(MODES)}, got {mode!r}")
    return mode


def _stack_views(clean: dict, perturbed: dict, pads: dict, padding_side: str) -> dict:
    """One batch of 2b rows: `clean` on top of `perturbed`, token fields padded to the longer view."""
    s = max(v.shape[1] for v in (clean["input_ids"], perturbed["input_ids"]))
    out = {}
    for k in clean:
        a, b = clean[k], perturbed[k]
        if a.dim() >= 2 and k in pads:  # (b, s) token fields
            def pad(t):
                extra = s - t.shape[1]
                if not extra:
                    return t
                fill = torch.full((t.shape[0], extra), pads[k], dtype=t.dtype)
                return torch.cat([fill, t] if padding_side == "left" else [t, fill], dim=1)
            a, b = pad(a), pad(b)
        out[k] = torch.cat([a, b], dim=0)
    return out


class PositionShiftCollator:
    """Wraps a Hugging Face data collator; adds `position_ids` shifted by RPP or Random Padding.

    Args:
        collator: the script's collator, `features -> batch` with input_ids and attention_mask.
        model: the model being trained: its position base, padding position and table size are read,
            and it gets the hook that uses the shifted view in training forwards only.
        tokenizer: its tokenizer (which token is the leading special that keeps its position).
        method: "rpp" (p_r ~ U{l .. M - l}, the paper's interval), "random_padding" (k ~ U{0 .. n - m})
            or "randomized_positions" (a sorted uniform random subset of the M ids after [CLS]'s).
        max_len: RPP's and randomized positions' M (default: the model's usable position table) or
            Random Padding's n (default: the tokenizer's model_max_length, within the table).
        cap: Random Padding's cap K on the shift (App. D); None for none.
        seed: seed of this collator's draws (module doc, Randomness).
        mode: "replace" (train on the shifted batch) or "augment" (clean + shifted rows, module doc);
            default: "augment" for RPP (the authors' step; RPP alone never trains positions 1 .. l-1),
            "replace" for Random Padding (its paper trains the re-padded batch only).
    """

    def __init__(self, collator, model, tokenizer, *, method: str = "rpp", max_len: int | None = None,
                 cap: int | None = None, seed: int = 0, mode: str | None = None):
        if method not in METHODS:
            raise ConfigError(f"method must be one of {list(METHODS)}, got {method!r}")
        if mode is None:
            mode = "augment" if method in ("rpp", "random_position_perturbation") else "replace"
        self.collator, self.method, self.mode, self.model = collator, method, _check_mode(mode), model
        self.base, self.pad_position, n_pos = position_numbering(model)
        _install_hook(model)
        usable = n_pos - self.base if n_pos is not None else None
        if max_len is None:
            tok_max = getattr(tokenizer, "model_max_length", None)
            sensible = tok_max if isinstance(tok_max, int) and tok_max < 1_000_000 else None
            max_len = (usable if method in ("rpp", "randomized_positions") or sensible is None
                       else min(sensible, usable or sensible))
        if max_len is None or max_len < 1:
            raise ConfigError(f"max_len must be a positive number of positions (the model has no position table "
                              f"to take it from), got {max_len!r}")
        if usable is not None and max_len > usable:
            raise ConfigError(f"max_len ({max_len}) + first position id ({self.base}) exceeds the model's "
                              f"max_position_embeddings ({n_pos})")
        self.max_len, self.cap = max_len, cap
        self.leading = _leading_special(tokenizer)
        self.padding_side = getattr(tokenizer, "padding_side", "right")
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self.draws = BatchDraws(seed)

    def shift(self, batch: dict) -> dict:
        """Shift one batch's positions.

        Args:
            batch: a collated batch with `input_ids` and `attention_mask`.

        Returns:
            A copy of `batch` with shifted `position_ids`.
        """
        generator = self.draws(batch)
        mask = batch["attention_mask"]
        cls_index = _cls_index(batch["input_ids"], mask, self.leading)
        lengths = mask.sum(-1)  # (b,) real tokens, specials included
        if self.method == "rpp":
            k = sample_rpp(lengths, cls_index >= 0, self.max_len, generator)
        elif self.method == "randomized_positions":
            try:
                k = sample_randomized_positions(lengths, cls_index >= 0, self.max_len, generator)  # (b, r)
            except ValueError as e:
                raise ConfigError(f"PositionShiftCollator max_len: {e}") from None
        else:
            k = sample_random_padding(lengths, self.max_len, self.cap, generator)
        out = dict(batch)
        out["position_ids"] = shift_position_ids(mask, cls_index, k, base=self.base, pad_position=self.pad_position)
        return out

    def view(self, batch: dict) -> dict:
        """What a training forward takes.

        Args:
            batch: a collated batch with `input_ids` and `attention_mask`.

        Returns:
            The shifted batch (`replace`), or the clean rows stacked on the shifted ones (`augment`).
        """
        shifted = self.shift(batch)
        if self.mode == "replace":
            return shifted

        clean = dict(batch, position_ids=position_ids(batch["attention_mask"], self.base, self.pad_position))
        pads = {"input_ids": self.pad_id, "attention_mask": 0, "token_type_ids": 0, "labels": IGNORE,
                "position_ids": self.pad_position}
        return _stack_views(clean, shifted, pads, self.padding_side)

    def __call__(self, features) -> dict:
        batch = dict(self.collator(features))
        return {**batch, VIEW: self.view(batch)}


class ContextPerturbationCollator:
    """Wraps a token-classification collator (`labels` per token, -100 where no loss); re-packs each
    batch by Context Perturbation (`posbias.perturb.context_concat`), labels carried along.

    Args:
        collator: e.g. `DataCollatorForTokenClassification(tokenizer)`.
        model: the model being trained: its position table bounds M, and it gets the hook that uses
            the re-packed view in training forwards only.
        tokenizer: its tokenizer (specials around a sentence, the joining separator, pad id, side).
        max_len: M, the most tokens of a concatenation (the paper: the whole table, 512); default
            the model's usable position table.
        seed: seed of this collator's draws (module doc, Randomness).
        mode: "augment" (clean rows + re-packed rows, module doc; the authors' step, the default) or
            "replace".
    """

    FIELDS = ("input_ids", "attention_mask", "labels", "token_type_ids")

    def __init__(self, collator, model, tokenizer, *, max_len: int | None = None, seed: int = 0,
                 mode: str = "augment"):
        self.collator, self.mode, self.model = collator, _check_mode(mode), model
        _install_hook(model)
        n_pos = getattr(model.config, "max_position_embeddings", None)
        usable = n_pos - position_id_base(_base_model(model))[0] if n_pos is not None else None
        if max_len is None:
            tok_max = getattr(tokenizer, "model_max_length", None)
            max_len = usable or (tok_max if isinstance(tok_max, int) and tok_max < 1_000_000 else None)
        if not isinstance(max_len, int) or max_len < 1:
            raise ConfigError(f"max_len must be a positive integer (M, tokens of a concatenation), got {max_len!r}")
        if usable is not None and max_len > usable:
            raise ConfigError(f"max_len ({max_len}) exceeds the model's usable position table ({usable})")
        prefix, suffix = special_tokens(tokenizer)
        self.max_len, self.prefix, self.suffix = max_len, prefix, suffix
        self.sep_id = separator_id(tokenizer)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self.padding_side = getattr(tokenizer, "padding_side", "right")
        self.draws = BatchDraws(seed)

    def perturb(self, batch: dict) -> dict:
        """Re-pack one batch by Context Perturbation.

        Args:
            batch: a token-classification batch: `input_ids`, `attention_mask`, `labels` (b, s).

        Returns:
            The re-packed batch (same number of rows), in the fields the model takes.

        Raises:
            ConfigError: a batch without per-token `labels`.
        """
        if "labels" not in batch or batch["labels"].dim() != 2:
            raise ConfigError("context perturbation needs a token-classification batch: `labels` of shape "
                              "(batch, tokens), -100 where no loss")
        mask = batch["attention_mask"]
        inner = {"input_ids": batch["input_ids"], "attention_mask": mask, "labels": batch["labels"],
                 **_word_fields(mask, batch["labels"], len(self.prefix), len(self.suffix))}
        if "token_type_ids" in batch:
            inner["token_type_ids"] = batch["token_type_ids"]
        out = concatenate_contexts(inner, self.draws(batch), max_len=self.max_len, prefix=self.prefix,
                                   suffix=self.suffix, sep_id=self.sep_id, pad_id=self.pad_id,
                                   padding_side=self.padding_side)
        return {k: out[k] for k in self.FIELDS if k in out}

    def view(self, batch: dict) -> dict:
        """What a training forward takes.

        Args:
            batch: a token-classification batch: `input_ids`, `attention_mask`, `labels` (b, s).

        Returns:
            The re-packed batch (`replace`), or the clean rows stacked on the re-packed ones (`augment`).

        Raises:
            ConfigError: a batch with fields Context Perturbation cannot carry.
        """
        extra = sorted(set(batch) - set(self.FIELDS))
        if extra:
            raise ConfigError(f"context perturbation re-packs rows and cannot carry the batch field(s) {extra}")
        packed = self.perturb(batch)
        if self.mode == "replace":
            return packed
        pads = {"input_ids": self.pad_id, "attention_mask": 0, "token_type_ids": 0, "labels": IGNORE}
        return _stack_views(batch, packed, pads, self.padding_side)

    def __call__(self, features) -> dict:
        batch = dict(self.collator(features))
        return {**batch, VIEW: self.view(batch)}


class _BindTarget:
    """What a posbias perturbation's `bind(model, tokenizer)` reads off a posbias model, for a Hugging
    Face one: its encoder (`.config`), position numbering and no positions before the tokens."""

    position_offset = 0

    def __init__(self, model):
        self.encoder = _base_model(model)
        self.position_base, self.position_pad = position_id_base(self.encoder)


class PerturbationCollator:
    """Wraps a Hugging Face data collator; applies any registered perturbation by name
    (`posbias.registry.PERTURBATIONS`), built from the same options as a config's `perturb` entry
    and bound to the model as the posbias training loop binds it.

    Args:
        collator: the script's collator, `features -> batch` with input_ids and attention_mask (and
            `labels` per token for perturbations that rebuild rows, Context Perturbation).
        model: the model being trained: it gets the hook that uses the perturbed view in training
            forwards only.
        tokenizer: its tokenizer.
        name: the perturbation's registered name (`rpp`, `random_padding`, `context_perturbation`,
            ... or a plug-in's).
        mode: "replace" or "augment" (clean + perturbed rows, module doc); default: the
            perturbation's paper mode (`paper_mode`), else replace.
        seed: seed of this collator's draws (module doc, Randomness).
        **options: the perturbation's options (`max_len`, `cap`, ...), checked by name and type.
            Where its default is data.max_seq_len, the tokenizer's model_max_length stands in.
    """

    def __init__(self, collator, model, tokenizer, name: str, *, mode: str | None = None, seed: int = 0, **options):
        tok_max = getattr(tokenizer, "model_max_length", None)
        self.perturbation = build_perturbation(
            name, options, key=name, max_seq_len=tok_max if isinstance(tok_max, int) and tok_max < 1_000_000 else None)
        self.name, self.collator, self.model = name, collator, model
        self.mode = _check_mode(mode if mode is not None else getattr(self.perturbation, "paper_mode", "replace"))
        self.sets_positions = bool(getattr(self.perturbation, "sets_positions", False))
        if self.sets_positions:
            position_numbering(model)  # refuses, by name, a model that shifted ids cannot reach
        target = _BindTarget(model)
        self.base, self.pad_position = target.position_base, target.position_pad
        bind = getattr(self.perturbation, "bind", None)
        if bind is not None:
            bind(target, tokenizer)
        _install_hook(model)
        self.leading = _leading_special(tokenizer)
        prefix, suffix = special_tokens(tokenizer)
        self.n_prefix, self.n_suffix = len(prefix), len(suffix)
        self.padding_side = getattr(tokenizer, "padding_side", "right")
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self.draws = BatchDraws(seed)

    def _inner(self, batch: dict) -> dict:
        """The batch in the fields posbias perturbations read: `cls_index` (the leading special's
        index, -1 where none) and, for a token-classification batch, the word and padding fields
        that Context Perturbation carries along."""
        mask = batch["attention_mask"]
        inner = dict(batch)
        inner["cls_index"] = _cls_index(batch["input_ids"], mask, self.leading)
        labels = batch.get("labels")
        if labels is not None and labels.dim() == 2:  # as ContextPerturbationCollator.perturb
            fields = _word_fields(mask, labels, self.n_prefix, self.n_suffix)
            inner.update({k: v for k, v in fields.items() if k != "cls_index" or not self.n_prefix})
        return inner

    def perturb(self, batch: dict) -> dict:
        """Apply the perturbation to one batch.

        Args:
            batch: a collated batch with `input_ids` and `attention_mask` (and `labels`).

        Returns:
            The perturbed batch, in the batch's own fields (plus `position_ids` where it sets them).

        Raises:
            ConfigError: a batch field the perturbation cannot carry.
        """
        out = self.perturbation(self._inner(batch), self.draws(batch))
        keep = set(batch) | ({"position_ids"} if "position_ids" in out else set())
        lost = sorted(k for k in batch if k not in out)
        if lost:
            raise ConfigError(f"{self.name} cannot carry the batch field(s) {lost}")
        return {k: out[k] for k in keep}

    def view(self, batch: dict) -> dict:
        """What a training forward takes.

        Args:
            batch: a collated batch with `input_ids` and `attention_mask` (and `labels`).

        Returns:
            The perturbed batch (`replace`), or the clean rows stacked on the perturbed ones (`augment`).
        """
        perturbed = self.perturb(batch)
        if self.mode == "replace":
            return perturbed
        clean = dict(batch)
        if "position_ids" in perturbed and "position_ids" not in clean:
            clean["position_ids"] = position_ids(batch["attention_mask"], self.base, self.pad_position)
        pads = {"input_ids": self.pad_id, "attention_mask": 0, "token_type_ids": 0, "labels": IGNORE,
                "position_ids": self.pad_position}
        return _stack_views(clean, perturbed, pads, self.padding_side)

    def __call__(self, features) -> dict:
        batch = dict(self.collator(features))
        return {**batch, VIEW: self.view(batch)}


def _callback_base():
    from transformers import TrainerCallback

    return TrainerCallback


# How a PositionBiasCallback user sets what an error about the labels suggests
# (`posbias.tagging.evaluate.align_labels`): its own arguments, not config keys.
CALLBACK_FRONT = {"tag_column": "data=posbias.tagging.readers.read_tagging(path, tag_column={})",
                  "tag": "data=posbias.tagging.readers.read_tagging(path, tag={!r})",
                  "tags_column": "data=posbias.tagging.readers.read_tagging_dataset(ds, tags_column={!r})",
                  "label_map": "label_map",
                  "labels": "pass labels=[...] (the tag names in id order) to PositionBiasCallback, or set "
                            "model.config.id2label and label2id"}


def _from_first_process(value):
    """`value` as the first process has it, on every process of an initialised torch.distributed
    group (the Trainer's); `value` itself otherwise."""
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


class PositionBiasCallback(_callback_base()):
    """At each evaluation, F1(α) of the model on the duplicated test sets D*_test(k) (Ben Amor et al.,
    §3; `posbias.tagging.duplicated.position_eval`), added to the Trainer's metrics as
    `<metric_key_prefix>_<metric>_alpha_<α>` (`eval_f1_alpha_10`; POS: `eval_accuracy_alpha_10`).

    Args:
        data: a CoNLL / CoNLL-U path or a posbias `TaggingDataset` with gold tags.
        tokenizer: the model's tokenizer.
        labels: the model's label names in id order (default: its config's id2label).
        k_max: duplicate each sentence k = 1 .. k_max times (as `posbias diagnose tagging --k-max`).
        quantiles: D*: the (low, high) length quantiles of the sentences scored.
        alphas: the α values whose F1(α) is reported (those up to `k_max`).
        batch_tokens: padded tokens per forward batch.
        length_pool: files (CoNLL / CoNLL-U paths) or `TaggingDataset`s whose sentence lengths
            pooled set D*'s bounds (the `quantiles` of them), as `data.length_pool_files`; the
            authors pool train, dev and test. Default: `data`'s own lengths.
        metric_key_prefix: the Trainer's prefix ("eval").
        label_map: data class -> the model's, when the data names its classes otherwise.
        precision: `trainer` (default: bf16 / fp16 autocast when the TrainingArguments ask for it,
            as the Trainer's own evaluation), or `fp32`, `bf16`, `fp16`, `auto` (`posbias.precision`).
    """

    def __init__(self, data, tokenizer, *, labels: list[str] | None = None, k_max: int = 10,
                 quantiles=(0.25, 0.75), alphas=(1, 5, 10), batch_tokens: int = POSITION_BATCH_TOKENS,
                 metric_key_prefix: str = "eval", label_map: dict | None = None, precision: str = "trainer",
                 length_pool=None):
        if precision != "trainer" and precision not in VALUES:
            raise ConfigError(f"precision must be trainer or one of {', '.join(VALUES)}, got {precision!r}")
        self.precision = precision

        def is_path(d) -> bool:
            return isinstance(d, (str, bytes, os.PathLike))

        def read(d):
            return read_tagging(os.fsdecode(d)) if is_path(d) else d

        self.dataset = read(data)
        self.length_pool = None
        if length_pool is not None:
            import numpy as np

            pool = [length_pool] if is_path(length_pool) else list(length_pool)
            if not pool:
                raise ConfigError("length_pool must name at least one file or data set")
            sets = [read(d) for d in pool]
            self.length_pool = (np.array([len(e.words) for ds in sets for e in ds.examples], dtype=np.int64),
                                [str(getattr(ds, "path", None) or d) for ds, d in zip(sets, pool)])
        self.tokenizer, self.labels, self.label_map = tokenizer, labels, label_map
        self.k_max, self.quantiles, self.alphas = k_max, quantiles, tuple(alphas)
        self.batch_tokens, self.prefix = batch_tokens, metric_key_prefix
        self.history: list[dict] = []
        self.subset = None
        self.trainer = None

    def attach(self, trainer) -> "PositionBiasCallback":
        """Add this callback to `trainer` and log through it, so trackers (TensorBoard, W&B, ...)
        receive the position metrics too (a plain callback only extends the evaluation's metrics).

        Args:
            trainer: the Hugging Face `Trainer`.

        Returns:
            This callback.
        """
        trainer.add_callback(self)
        self.trainer = trainer
        return self

    def position_metrics(self, model, args=None) -> dict:
        """Score a model on the duplicated test sets now, outside an evaluation.

        Args:
            model: a Hugging Face token-classification model.
            args: the Trainer's TrainingArguments (their bf16 / fp16 under `precision="trainer"`).

        Returns:
            `<prefix>_<metric>_alpha_<α>` -> F1(α) (POS: accuracy(α)).
        """
        spec = self.precision
        if spec == "trainer":
            spec = "bf16" if getattr(args, "bf16", False) else "fp16" if getattr(args, "fp16", False) else "fp32"
        device = next(model.parameters()).device
        view = tagger_view(model, self.labels)
        dataset = align_labels(self.dataset, view.labels, view.scheme, self.label_map, label_source=view.label_source,
                               front=CALLBACK_FRONT)
        with autocast(device, resolve_precision(spec, device, "precision")):
            result = position_eval(view, self.tokenizer, dataset, k_max=self.k_max, quantiles=self.quantiles,
                                   modes=("duplicate",), batch_tokens=self.batch_tokens, progress=False,
                                   length_pool=self.length_pool)
        self.subset = result["subset"]  # D*'s bounds and sizes of the last evaluation
        flat = summary(result, alphas=self.alphas)
        key = result["metric"]
        keep = [f"{key}_alpha_{a}" for a in self.alphas if a <= self.k_max]
        return {f"{self.prefix}_{k}": flat[k] for k in keep if k in flat}

    def on_evaluate(self, args, state, control, model=None, metrics=None, **kwargs):
        if model is None:
            return control
        # Every process scores (each holds the same weights) and takes the first process's numbers:
        # the metrics are present and equal everywhere (best-model selection reads them on each
        # process), and no process waits in a collective while another computes.
        new = _from_first_process(self.position_metrics(model, args))
        if metrics is not None:
            metrics.update(new)  # the dict trainer.evaluate() returns and best-model selection reads
        self.history.append({**new, "step": state.global_step})
        if self.trainer is not None:
            self.trainer.log(dict(new))  # log_history + every callback's on_log (the trackers)
        else:
            state.log_history.append({**new, "step": state.global_step})
        return control
