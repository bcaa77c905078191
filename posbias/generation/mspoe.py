"""Ms-PoE: multi-scale positional encoding, a training-free fix for "lost in the middle".

Zhang et al., "Found in the Middle: How Language Models Use Long Contexts Better via Plug-and-Play
Positional Encoding", NeurIPS 2024 (arXiv:2403.04797; code: github.com/VITA-Group/Ms-PoE). The
equation numbers are not in the authors' repository, so the three pieces are named in words:

1. Position re-scaling: RoPE rotates a query or key at position p by the angles p * theta_j; Ms-PoE
   rotates it at p / r instead (r >= 1), so every relative distance p - p' shrinks to (p - p') / r,
   which the paper argues relieves RoPE's long-term decay that buries the middle of a long context.
2. Multi-scale ratios: head i of a patched layer gets its own ratio, spread evenly from the minimum
   alpha to the maximum beta (1.2 and 1.8 in the paper), r_i = alpha + (beta - alpha) * i / N for the
   N heads (`head_ratios`; the authors' MsPoELlamaRotaryEmbedding: beta itself is never reached).
3. Position-aware head order: heads whose attention has many outliers (weights above 3x the row's
   mean) are taken to carry positional information and get the smallest ratios; the score is read
   from the attention of the last query, before any rotation (`outlier_scores`, `assign_ratios`).

What the authors' code does (utils/modify_arch/llama.py, src/ms_poe.sh, inference.py) and posbias
follows: layers 2 .. L-1 are patched, the first two left alone (`--apply_layers "2,...,31"` on the
32 layers of Vicuna-7B: `layers=None` here); the head order is computed per input, once, at the
first forward of each `generate` (the prefill; `model._reset()` after every prompt), from the
unrotated queries and keys, the model's causal mask and a softmax over the last query's row; decode
steps reuse it, and the cached keys are stored already rotated at their scaled positions.

Where posbias deviates, and why:
- The authors index the ratio table by the argsort of the scores (`cos[self.head_order]`), which
  gives head j the ratio of rank `order[j]`, a permutation of the paper's rule rather than the rule;
  posbias gives the head of rank k the k-th smallest ratio, as the paper describes.
- Grouped-query attention: their code rotates a shared key once, with the ratio of the first query
  head of its group (`sample_rotary_emb`), so the other heads of the group see mismatched query and
  key scales. Here every query head rotates its own copy of the key at p / r_h: the patched layers
  cache keys and values per query head (`num_key_value_groups` times the memory of those layers).
- Batches: their statistics assume one unpadded row; here the order is computed per row, and the
  outlier threshold counts only the keys the query may see (3 / n_visible), so left padding and
  sliding windows change nothing (their 3x mean over the whole row equals it without padding).
  Ties in the score keep the lower head index first (a stable sort).
- `order="index"` (head i gets r_i, no statistics) is offered for ablations, and `order="reversed"` is the
  authors' own `--head_type normal` (head i gets r_{N-1-i}), which their scripts use for the answer
  positions 5, 7 and 10 of 10 and the outlier order for 1 and 3 (a choice by gold position, which a
  diagnosis that does not know the gold position cannot make: posbias applies one order to all).
- Layers: the authors patch every layer but the first two of a full-attention model. On a model that
  mixes sliding-window and global layers (Gemma 2 and 3) posbias patches the global ones by default
  (`resolve_layers`); `layers="all"` is the authors' choice.

Mechanics in transformers 5: `ms_poe` replaces the `forward` of the chosen attention modules with
`_MsPoEForward` (projections, optional q_norm / k_norm, per-head rotation with the layer's own
inv_freq and attention_scaling, eager attention, o_proj) and switches the model's configs to
`attn_implementation="eager"` while it is on, because only the eager path hands every layer its
materialised additive (b, 1, s, t) mask, sliding window and padding included (under sdpa, 5.24 passes
a boolean mask, or None where it relies on `is_causal`: every layer of an unpadded Llama batch, the
full-attention layers of Gemma 3). On exit every forward and config value is put back as it was,
even after an exception.

Shape legend: b batch, h query heads, g key/value heads, s query length, t key length (cache
included), d head dim.
"""
from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence

import torch
from torch import nn

from ..errors import ConfigError

# Decoders whose attention is exactly: q/k/v projections, optional q_norm/k_norm over the head dim,
# full-width RoPE with rotate_half, cache.update, eager attention, o_proj (checked against
# transformers 5.24's modeling files). The value says whether the family softcaps attention logits:
# Gemma 2 passes `softcap` to its attention, Gemma 3 does not (5.24 ignores attn_logit_softcapping).
SUPPORTED = {"llama": False, "mistral": False, "qwen2": False, "qwen3": False, "gemma": False,
             "gemma2": True, "gemma3_text": False}
ORDERS = ("outlier", "reversed", "index")
"""Head orders: the paper's outlier ranking; the authors' fixed reversed order (their `--head_type normal`,
which their scripts use for the gold positions 5, 7 and 10 of 10: head i gets r_{N-1-i}); and the index
order (head i gets r_i), for ablations."""
FIRST_PATCHED_LAYER = 2  # the authors' --apply_layers starts at 2: the first two layers keep plain RoPE
LAYER_CHOICES = ("auto", "all", "global")
"""`layers` by name (`resolve_layers`): `all` is the authors' choice, every layer but the first two;
`global` the global-attention layers among them; `auto` the global ones on a model that mixes sliding-window
and global attention (Gemma 2 and 3), `all` on a full-attention model (the authors' Vicuna-7B)."""


def head_ratios(num_heads: int, min_ratio: float = 1.2, max_ratio: float = 1.8) -> torch.Tensor:
    """(h,) float32 ratios r_i = min + (max - min) * i / h, i = 0 .. h-1: evenly spaced from
    `min_ratio` towards `max_ratio`, which is not reached (the authors' MsPoELlamaRotaryEmbedding;
    32 heads at 1.2 .. 1.8 give 1.2 .. 1.78125)."""
    if not isinstance(num_heads, int) or num_heads < 1:
        raise ConfigError(f"ms_poe: num_heads must be a positive integer, got {num_heads!r}")
    _check_ratios(min_ratio, max_ratio)
    i = torch.arange(num_heads, dtype=torch.float64)
    return (min_ratio + (max_ratio - min_ratio) * i / num_heads).float()


def outlier_scores(weights: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
    """(b, h) the paper's position-awareness score: the fraction of visible keys whose attention
    weight exceeds 3 / n_visible, three times the mean weight of the row.

    Args:
        weights: (b, h, t) softmax attention of one query per row (the last one in the paper).
        visible: (b, t) bool, the keys that query may attend to (not padding, inside its window).
    """
    n = visible.sum(-1).clamp(min=1)  # (b,) n_visible
    above = (weights > (3.0 / n)[:, None, None]) & visible[:, None, :]  # (b, h, t)
    return above.sum(-1) / n[:, None]  # (b, h)


def assign_ratios(scores: torch.Tensor, ratios: torch.Tensor) -> torch.Tensor:
    """(b, h) the ratio of each head: ranked by `scores` (b, h) from the most position-aware down,
    the head of rank k gets ratios[k] (ratios ascending, `head_ratios`), so the heads that use
    position most get the smallest re-scaling. Ties keep the lower head index first."""
    order = torch.sort(scores, dim=-1, descending=True, stable=True).indices  # (b, h) head ids by rank
    table = ratios.to(scores.device, torch.float32).expand(scores.shape[0], -1)  # (b, h) ratio by rank
    return torch.empty_like(table).scatter_(1, order, table)  # (b, h) ratio by head id


def _check_ratios(min_ratio, max_ratio) -> None:
    for name, v in (("min_ratio", min_ratio), ("max_ratio", max_ratio)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise ConfigError(f"ms_poe: {name} must be a finite number, got {v!r}")
        # Ratios below 1 stretch positions past those the model was trained on; the paper uses 1.2 .. 1.8.
        if v < 1:
            raise ConfigError(f"ms_poe: {name} must be >= 1 (positions are divided by it), got {v!r}")
    if min_ratio > max_ratio:
        raise ConfigError(f"ms_poe: min_ratio ({min_ratio}) must be <= max_ratio ({max_ratio})")


def _supported(model: nn.Module):
    """(the decoder, its model type) of a model Ms-PoE can patch; one line naming the type otherwise."""
    decoder = _decoder(model)
    config = getattr(decoder if decoder is not None else model, "config", None)
    model_type = getattr(config, "model_type", type(model).__name__)
    if decoder is None or model_type not in SUPPORTED:
        raise ConfigError(f"ms_poe: model type {model_type!r} is not a supported RoPE decoder "
                          f"(supported: {', '.join(sorted(SUPPORTED))})")
    return decoder, model_type


def layer_kinds(model: nn.Module) -> list[str]:
    """Each decoder layer's attention: "full_attention" or "sliding_attention" (config.layer_types where
    the config has it, else full attention everywhere unless a sliding window covers every layer)."""
    decoder = _decoder(model)
    config = getattr(decoder if decoder is not None else model, "config", None)
    n = len(decoder.layers) if decoder is not None else int(getattr(config, "num_hidden_layers", 0))
    kinds = getattr(config, "layer_types", None)
    if isinstance(kinds, (list, tuple)) and len(kinds) == n:
        return ["sliding_attention" if "sliding" in str(k) else "full_attention" for k in kinds]
    window = getattr(config, "sliding_window", None) if getattr(config, "use_sliding_window", True) else None
    return ["sliding_attention" if window else "full_attention"] * n


def resolve_layers(model: nn.Module, layers="auto") -> list[int]:
    """The layer indices Ms-PoE patches for `layers` (`LAYER_CHOICES` or a list of indices).

    Ms-PoE's premise is RoPE's long-range decay over the whole context, which a global-attention layer
    has; a sliding-window layer sees only its window (512 tokens on Gemma 3), where re-scaling positions
    only distorts short-range codes. So on models that mix the two the default patches the global
    layers (the authors ran full-attention models only: there every layer but the first two).
    """
    _supported(model)
    if layers is None:
        layers = "auto"
    if isinstance(layers, str):
        if layers not in LAYER_CHOICES:
            raise ConfigError(f"ms_poe: layers must be one of {', '.join(LAYER_CHOICES)} or a list of indices, "
                              f"got {layers!r}")
        kinds = layer_kinds(model)
        authors = list(range(FIRST_PATCHED_LAYER, len(kinds)))
        global_ = [i for i in authors if kinds[i] == "full_attention"]
        hybrid = len(set(kinds)) > 1
        chosen = global_ if layers == "global" or (layers == "auto" and hybrid) else authors
        if not chosen:
            raise ConfigError(f"ms_poe: the model has no {'global-attention ' if layers == 'global' else ''}layer "
                              f"after the first {FIRST_PATCHED_LAYER} ({len(kinds)} layers); pass layers=[...]")
        return chosen
    return list(layers)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _repeat_heads(x: torch.Tensor, groups: int) -> torch.Tensor:
    """(b, g, n, d) -> (b, g * groups, n, d): query head i reads key/value head i // groups."""
    return x if groups == 1 else x.repeat_interleave(groups, dim=1)


class MsPoEHandle:
    """What `ms_poe` yields: the patched layers, the ratios their heads got at the last prefill, and
    the query whose attention orders the heads.

    `query_index`: None (the last position, as the authors at prefill) or a (b,) tensor of positions
    in the sequence, one per row, read by forwards without a cache and at prefill. A scorer that runs
    prompt + answer in one forward sets it to each row's last prompt token, so that the heads are
    ordered as `generate` would order them on the prompt alone; set it back to None (or to the next
    batch's positions) before a batch of another size.
    """

    def __init__(self, layers: Sequence[int]):
        self.layers = tuple(layers)
        self.query_index: torch.Tensor | None = None
        self.ratios: dict[int, torch.Tensor | None] = {i: None for i in self.layers}  # layer -> (b, h)


class _MsPoEForward:
    """The forward of one patched attention module (module docstring)."""

    def __init__(self, module: nn.Module, rotary: nn.Module, ratios: torch.Tensor, order: str, softcaps: bool,
                 handle: MsPoEHandle):
        self.module, self.ratios, self.order, self.handle = module, ratios, order, handle
        self.softcap = getattr(module, "attn_logit_softcapping", None) if softcaps else None
        layer_type = getattr(module, "layer_type", None)
        # Gemma 3 keeps one inv_freq per layer type (local rope_theta on sliding layers); the others one.
        self.inv_name, self.scale_name = "inv_freq", "attention_scaling"
        if layer_type is not None and hasattr(rotary, f"{layer_type}_inv_freq"):
            self.inv_name, self.scale_name = f"{layer_type}_inv_freq", f"{layer_type}_attention_scaling"
        self.rotary = rotary

    def _cos_sin(self, position_ids: torch.Tensor, ratio: torch.Tensor, dtype: torch.dtype):
        """(b, h, s, d) cos and sin at positions p / r_h, in float32 as the model's rotary embedding
        computes them (read at call time: dynamic RoPE types update inv_freq in the model's forward)."""
        inv_freq = getattr(self.rotary, self.inv_name).to(position_ids.device, torch.float32)  # (d/2,)
        scaling = getattr(self.rotary, self.scale_name)
        scaled = position_ids[:, None, :].float() / ratio[:, :, None]  # (b, h, s) p / r_h
        freqs = scaled[..., None] * inv_freq  # (b, h, s, d/2)
        emb = torch.cat((freqs, freqs), dim=-1)  # (b, h, s, d)
        return (emb.cos() * scaling).to(dtype), (emb.sin() * scaling).to(dtype)

    def _order_heads(self, q, k, mask, b: int) -> torch.Tensor:
        """(b, h) ratios for the rows of this input, from the unrotated attention of one query per row."""
        m = self.module
        if self.order == "index":
            return self.ratios.to(q.device).expand(b, -1)
        if self.order == "reversed":  # the authors' --head_type normal: head i gets r_{N-1-i}
            return self.ratios.flip(0).to(q.device).expand(b, -1)
        idx = self.handle.query_index
        s = q.shape[2]
        idx = torch.full((b,), s - 1, device=q.device) if idx is None else idx.to(q.device).long().reshape(-1)
        if idx.shape[0] != b or bool(((idx < 0) | (idx >= s)).any()):
            raise ConfigError(f"ms_poe: query_index must hold one position in 0..{s - 1} per row of the batch ({b})")
        rows = torch.arange(b, device=q.device)
        q_last = q[rows, :, idx][:, :, None]  # (b, h, 1, d)
        logits = (q_last @ _repeat_heads(k, m.num_key_value_groups).transpose(2, 3)) * m.scaling  # (b, h, 1, t)
        if self.softcap is not None:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        if mask is not None:
            row_mask = mask.expand(b, -1, -1, -1)[rows, :, idx][:, :, None, : logits.shape[-1]]  # (b, 1, 1, t)
            logits = logits + row_mask
            visible = row_mask[:, 0, 0] > torch.finfo(row_mask.dtype).min / 2  # (b, t)
        else:  # eager passes None only when nothing is masked
            visible = torch.ones(b, logits.shape[-1], dtype=torch.bool, device=q.device)
        weights = torch.softmax(logits.float(), dim=-1)[:, :, 0]  # (b, h, t)
        return assign_ratios(outlier_scores(weights, visible), self.ratios)

    def __call__(self, hidden_states: torch.Tensor, position_embeddings=None, attention_mask=None, cache=None,
                 **kwargs):
        m = self.module
        if cache is None:
            cache = kwargs.pop("past_key_values", None)
        b, s, _ = hidden_states.shape
        shape = (b, s, -1, m.head_dim)
        q = m.q_proj(hidden_states).view(shape).transpose(1, 2)  # (b, h, s, d)
        k = m.k_proj(hidden_states).view(shape).transpose(1, 2)  # (b, g, s, d)
        v = m.v_proj(hidden_states).view(shape).transpose(1, 2)  # (b, g, s, d)
        if getattr(m, "q_norm", None) is not None:  # Gemma 3, Qwen3: RMSNorm over d, before RoPE
            q, k = m.q_norm(q), m.k_norm(k)

        past = cache.get_seq_length(m.layer_idx) if cache is not None else 0
        if past == 0:  # a forward without a cache, or a prefill: order the heads for this input
            ratio = self._order_heads(q, k, attention_mask, b)  # (b, h)
            self.handle.ratios[m.layer_idx] = ratio
        else:  # a decode step keeps the prefill's order, as the authors' code does
            ratio = self.handle.ratios[m.layer_idx]
            if ratio is None or ratio.shape[0] != b:
                raise ConfigError("ms_poe: a cached decode step needs the prefill of the same batch under ms_poe "
                                  "(start generate inside the `with ms_poe(...)` block)")

        position_ids = kwargs.get("position_ids")
        if position_ids is None:
            position_ids = torch.arange(past, past + s, device=q.device)[None]
        position_ids = position_ids.expand(b, -1)  # (b, s)
        cos, sin = self._cos_sin(position_ids, ratio, q.dtype)  # (b, h, s, d)
        q = q * cos + _rotate_half(q) * sin  # (b, h, s, d)
        k = _repeat_heads(k, m.num_key_value_groups)  # (b, h, s, d): one copy per query head, rotated at its r
        k = k * cos + _rotate_half(k) * sin
        v = _repeat_heads(v, m.num_key_value_groups)  # (b, h, s, d)
        if cache is not None:
            k, v = cache.update(k, v, m.layer_idx, kwargs=kwargs)  # (b, h, t, d)

        scores = (q @ k.transpose(2, 3)) * m.scaling  # (b, h, s, t)
        if self.softcap is not None:
            scores = torch.tanh(scores / self.softcap) * self.softcap
        if attention_mask is not None:
            scores = scores + attention_mask[:, :, :, : k.shape[-2]]
        weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)  # (b, h, s, t)
        weights = nn.functional.dropout(weights, p=m.attention_dropout if m.training else 0.0, training=m.training)
        out = (weights @ v).transpose(1, 2).reshape(b, s, -1)  # (b, s, h * d)
        return m.o_proj(out), weights


def _decoder(model: nn.Module) -> nn.Module | None:
    """The module holding `layers` and `rotary_emb`: XForCausalLM.model, or a bare XModel."""
    for candidate in (model, getattr(model, "model", None)):
        if candidate is not None and hasattr(candidate, "layers") and hasattr(candidate, "rotary_emb"):
            return candidate
    return None


def _configs(model: nn.Module, decoder: nn.Module) -> list:
    """Every distinct config the model reads its attention implementation from (sub-configs too)."""
    seen, todo = {}, [getattr(model, "config", None), getattr(decoder, "config", None)]
    while todo:
        cfg = todo.pop()
        if cfg is None or id(cfg) in seen:
            continue
        seen[id(cfg)] = cfg
        todo.extend(getattr(cfg, key, None) for key in getattr(cfg, "sub_configs", {}) or {})
    return list(seen.values())


@contextlib.contextmanager
def ms_poe(model: nn.Module, *, min_ratio: float = 1.2, max_ratio: float = 1.8,
           layers: Sequence[int] | str | None = "auto", order: str = "outlier") -> Iterator[MsPoEHandle]:
    """Turn Ms-PoE on for the duration of a `with` block; the model is restored exactly on exit.

    Args:
        model: a Hugging Face causal LM (or its bare decoder) of a type in `SUPPORTED`.
        min_ratio, max_ratio: the ratio range (`head_ratios`), 1 <= min <= max; min = max = 1 is the
            unmodified model (computed in eager attention).
        layers: layer indices to patch, or a name (`resolve_layers`): "auto" (default; None too): "global"
            on a model that mixes sliding-window and global layers, else "all"; "all": every layer but
            the first two, as the authors; "global": the global-attention layers among those.
        order: "outlier" (the paper: heads ranked by `outlier_scores`), "reversed" (the authors'
            `--head_type normal`: head i gets r_{N-1-i}) or "index" (head i gets r_i).

    Yields:
        `MsPoEHandle` (patched layers, the ratios each head got at the last prefill, `query_index`).

    A forward without a cache (`use_cache=False`; position_ids, logits_to_keep as usual) orders the
    heads of each row at `handle.query_index` (default: the last position). Scoring prompt + answer
    in one forward should set it, per batch, to each row's last prompt token (with left padding:
    `s - 1 - len(answer)`), which is where `generate` orders them; left as None, the answer's last
    token orders them. `generate` (greedy or sampled; dynamic, sliding-window or static cache) orders
    the heads at the prefill and keeps that order for every new token, rotated at its own position
    (the model's position_ids, counted from the first real token under left padding) divided by its
    head's ratio, as the authors' code does. Beam search keeps the beams of one input together, and
    they share its order. Cost: eager attention materialises (b, h, s, t) scores, and the patched
    layers cache keys and values per query head.
    """
    decoder, model_type = _supported(model)
    _check_ratios(min_ratio, max_ratio)
    if order not in ORDERS:
        raise ConfigError(f"ms_poe: order must be one of {', '.join(ORDERS)}, got {order!r}")
    n_layers = len(decoder.layers)
    if layers is None or isinstance(layers, str):
        layers = resolve_layers(model, layers)
    layers = list(layers)
    bad = [i for i in layers if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < n_layers]
    if bad or len(set(layers)) != len(layers) or not layers:
        raise ConfigError(f"ms_poe: layers must be distinct indices in 0..{n_layers - 1}, got {layers!r}")

    handle = MsPoEHandle(layers)
    patches = []
    for i in layers:
        attn = decoder.layers[i].self_attn
        ratios = head_ratios(attn.q_proj.out_features // attn.head_dim, min_ratio, max_ratio)  # (h,)
        forward = _MsPoEForward(attn, decoder.rotary_emb, ratios, order, SUPPORTED[model_type], handle)
        rotated = 2 * getattr(decoder.rotary_emb, forward.inv_name).numel()
        if rotated != attn.head_dim:  # partial rotary would rotate only part of each head
            raise ConfigError(f"ms_poe: layer {i} rotates {rotated} of {attn.head_dim} head dims; "
                              "only full-width RoPE is supported")
        patches.append((attn, forward))

    saved_impl = [(cfg, getattr(cfg, "_attn_implementation_internal", None)) for cfg in _configs(model, decoder)]
    saved_forward = [(attn, attn.__dict__.get("forward")) for attn, _ in patches]
    try:
        for cfg, _ in saved_impl:
            cfg._attn_implementation_internal = "eager"
        for attn, forward in patches:
            attn.forward = forward
        yield handle
    finally:
        for attn, original in saved_forward:
            if original is None:
                attn.__dict__.pop("forward", None)
            else:
                attn.forward = original
        for cfg, impl in saved_impl:
            cfg._attn_implementation_internal = impl
