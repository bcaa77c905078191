"""Position shifting: Random Padding (Tao et al., "A Frustratingly Easy Improvement for Position
Embeddings via Random Padding", §3 and App. D), as a training-time perturbation.

Random Padding moves k of the n - m padding tokens of a window to just after [CLS]:
    [CLS] {k [PAD]} question [SEP] context [SEP] {(n - m - k) [PAD]},   k ~ U{0 .. n - m}
With absolute position embeddings and masked padding this is exactly the same as keeping the
window unpadded and giving every token after [CLS] the position id `original + k` ([CLS] stays at
position 0): padding only ever contributes through masked attention (weight 0). So posbias shifts
position ids and keeps dynamic padding (tests/test_position_shift.py proves the equivalence on
logits and encoder gradients against the literal pad-moving input).

The mechanism is shared: a sampler draws k per window, `shift_position_ids` applies it. Random
Position Perturbation for tagging (another issue) is the same mechanism with another sampler.

Shape legend: b batch, s sequence.
"""
from __future__ import annotations

import warnings

import torch

from ..errors import ConfigError
from ..registry import PERTURBATIONS

# Encoders whose positions are relative or rotary: shifting absolute ids changes nothing.
RELATIVE_POSITION_TYPES = {"relative_key", "relative_key_query", "rotary"}
RELATIVE_POSITION_MODELS = {"roformer", "deberta", "deberta-v2", "xlnet", "t5", "funnel", "mpnet"}


def shift_position_ids(attention_mask: torch.Tensor, cls_index: torch.Tensor, shift: torch.Tensor, *,
                       base: int = 0, pad_position: int = 0) -> torch.Tensor:
    """(b, s) position ids: real tokens numbered from `base`, every real token but [CLS] moved by
    shift[b]; padding gets `pad_position`.

    Args:
        attention_mask: (b, s) 1 for real tokens.
        cls_index: (b,) position of [CLS] in each row (it keeps its unshifted id); -1 when the row
            has none (decoder tokenizers), and then every real token moves.
        shift: (b,) non-negative integers k.
        base: first position id (0 for BERT/ELECTRA, padding_idx + 1 for RoBERTa).
    """
    mask = attention_mask.long()
    pos = mask.cumsum(-1) - 1 + base  # (b, s)
    moved = mask.bool().clone()
    has_cls = cls_index >= 0  # -1: no leading special token (GPT-2, BLOOM): every token moves
    rows = torch.arange(mask.shape[0], device=mask.device)
    moved[rows[has_cls], cls_index[has_cls]] = False
    pos = pos + moved.long() * shift[:, None]
    return pos.masked_fill(mask == 0, pad_position)


def sample_random_padding(lengths: torch.Tensor, max_len: int, cap: int | None,
                          generator: torch.Generator) -> torch.Tensor:
    """k ~ Uniform{0 .. min(cap, max_len - m)} per window of m real tokens (App. D's cap K)."""
    hi = (max_len - lengths).clamp(min=0)
    if cap is not None:
        hi = hi.clamp(max=cap)
    u = torch.rand(lengths.shape, generator=generator)
    return torch.minimum((u * (hi + 1).double()).long(), hi)  # (b,), uniform over 0..hi


class PositionShift:
    """A training-time perturbation: draws k per window with `sampler`, sets batch["position_ids"]."""

    def __init__(self, sampler, max_len: int, key: str):
        self.sampler = sampler
        self.max_len = max_len
        self.key = key  # the dotted config key, for error messages
        self.base, self.pad_position = 0, 0

    def bind(self, model) -> None:
        """Adopt the model's position numbering; refuse shifts past its position table."""
        config = model.encoder.config
        self.base, self.pad_position = model.position_base, model.position_pad
        kind = getattr(config, "position_embedding_type", "absolute")
        if kind in RELATIVE_POSITION_TYPES or config.model_type in RELATIVE_POSITION_MODELS:
            warnings.warn(f"{self.key}: {config.model_type} uses {kind if kind != 'absolute' else 'relative'} "
                          "positions; shifting position ids has no effect on it", stacklevel=2)
        n_pos = getattr(config, "max_position_embeddings", None)
        if n_pos is not None and self.base + self.max_len > n_pos:
            raise ConfigError(
                f"{self.key}.max_len ({self.max_len}) + first position id ({self.base}) exceeds the encoder's "
                f"max_position_embeddings ({n_pos}); lower {self.key}.max_len (default data.max_seq_len)")

    def __call__(self, batch: dict, generator: torch.Generator) -> dict:
        lengths = batch["attention_mask"].sum(-1)  # (b,) m: real tokens, specials included
        shift = self.sampler(lengths, generator)
        out = dict(batch)  # a new batch: the input is not modified
        out["position_ids"] = shift_position_ids(batch["attention_mask"], batch["cls_index"], shift,
                                                 base=self.base, pad_position=self.pad_position)
        out["position_shift"] = shift
        return out


@PERTURBATIONS.register("random_padding")
def random_padding(options: dict, cfg, key: str = "perturb[0]") -> PositionShift:
    """Options: `max_len` n (default data.max_seq_len), `cap` K (App. D; default none)."""
    unknown = set(options) - {"max_len", "cap"}
    if unknown:
        raise ConfigError(f"{key}: unknown option {sorted(unknown)[0]!r} for random_padding (max_len, cap)")
    max_len = options.get("max_len") or cfg.data.max_seq_len
    cap = options.get("cap")
    for name, v in (("max_len", max_len), ("cap", cap)):
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 0):
            raise ConfigError(f"{key}.{name} must be a non-negative integer, got {v!r}")
    return PositionShift(lambda lengths, gen: sample_random_padding(lengths, max_len, cap, gen), max_len, key)
