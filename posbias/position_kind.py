"""How an encoder uses token positions, read from its transformers config (absolute, relative,
rotary or none): what decides whether Random Padding, RPP, randomized positions and shift mode can
move its words. Imports nothing from posbias, so that every layer (perturbations, encoders, tasks)
can ask it."""
from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class PositionKind:
    """How an encoder uses token positions, as its config says (`position_kind`).

    Attributes:
        kind: "absolute" (a table indexed by position ids, added to the input: BERT, RoBERTa,
            ELECTRA, ALBERT, DistilBERT, GPT-2), "relative" (attention terms of token distances:
            DeBERTa, T5, MPNet, Funnel, posbias's relative_key BERT), "rotary" (RoPE: ModernBERT,
            RoFormer, Llama) or "none" (no position table for ids to index: BLOOM's ALiBi, XLNet).
        model_type: the config's model_type, named in messages.
        decided_by: the config attribute (with its value) that decided, named in messages.
        absolute_input: a relative model that also adds absolute embeddings of the position ids
            to its input (DeBERTa with position_biased_input, MPNet): shifted ids move those.
    """

    kind: str
    model_type: str
    decided_by: str
    absolute_input: bool = False

    def __str__(self) -> str:
        uses = "no position ids" if self.kind == "none" else f"{self.kind} positions"
        return f"{self.model_type} uses {uses} (config {self.decided_by})"


# Config keys that hold rotary (RoPE) parameters: rope_parameters (transformers 5: ModernBERT, Llama),
# rope_theta, global_rope_theta / local_rope_theta (ModernBERT's 4.x config.json), rope_scaling,
# rotary_value (RoFormer, whose config has no other position key), rotary_dim, rotary_pct, ...
_ROTARY_KEY = re.compile(r"(^|_)(rope|rotary)(_|$)")


def _config_items(config) -> dict:
    items = config.to_dict() if hasattr(config, "to_dict") else {}
    return {**items, **{k: v for k, v in vars(config).items() if not k.startswith("_")}}


def position_kind(config) -> PositionKind:
    """How an encoder with this transformers config uses positions, read from the config's own
    attributes, never from a list of model names (a new architecture says it in its config).

    In order: an explicit `position_embedding_type` (BERT-style configs, ESM's "rotary", posbias's
    relative_key / relative_key_query); alibi=True; any rotary parameter; DeBERTa's relative_attention with a
    pos_att_type; T5-style relative_attention_num_buckets; Funnel's relative attention_type; no
    position table at all (no max_position_embeddings, or DeBERTa's position_biased_input=False);
    else an absolute table of max_position_embeddings rows.
    """
    model_type = getattr(config, "model_type", None) or type(config).__name__

    def found(k: str, why: str, absolute_input: bool = False) -> PositionKind:
        return PositionKind(k, model_type, why, absolute_input)

    said = getattr(config, "position_embedding_type", None)
    if said is not None:
        why = f"position_embedding_type={said!r}"
        if said == "absolute":
            return found("absolute", why)
        # posbias's relative_key(_query) attention zeroes the absolute table (as 4.x skipped it).
        return found("rotary" if "rot" in str(said) else "relative", why)
    items = _config_items(config)
    if items.get("alibi") is True:  # Falcon-style: ALiBi biases instead of its rope_theta
        return found("none", "alibi=True")
    rotary = sorted(k for k, v in items.items() if _ROTARY_KEY.search(k) and v is not None
                    and not (k.startswith("use_") and v is False))
    if rotary:
        return found("rotary", rotary[0])
    biased = items.get("position_biased_input")
    if items.get("relative_attention") and items.get("pos_att_type"):  # DeBERTa's disentangled attention
        absolute_input = biased is None or bool(biased)
        return found("relative", "relative_attention=True" + (", position_biased_input=True" if absolute_input else
                                                                 ", position_biased_input=False"), absolute_input)
    n_pos = getattr(config, "max_position_embeddings", None)
    table = isinstance(n_pos, int) and n_pos > 0
    buckets = items.get("relative_attention_num_buckets")
    if buckets:  # T5's bias buckets; MPNet adds them to its absolute table
        return found("relative", f"relative_attention_num_buckets={buckets}", absolute_input=table)
    if items.get("attention_type") in ("relative_shift", "factorized"):  # Funnel: both are relative
        return found("relative", f"attention_type={items['attention_type']!r}")
    if biased is False:  # DeBERTa without relative attention nor input positions
        return found("none", "position_biased_input=False")
    if not table:
        return found("none", f"max_position_embeddings={n_pos}" if n_pos is not None else "has no max_position_embeddings")
    return found("absolute", f"max_position_embeddings={n_pos}")
