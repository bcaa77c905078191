"""Relative position attention for BERT-style encoders, as transformers 4.x's BERT defined it.

transformers 5 dropped `position_embedding_type="relative_key"` / `"relative_key_query"` from
`BertSelfAttention`. posbias keeps them as an encoder option, because they are the natural
control for position bias: an encoder that only sees distances cannot favour absolute slots.
`apply_relative_positions` patches a built encoder in place; the parameter names match 4.x
(`...attention.self.distance_embedding.weight`) and the query/key/value weights are untouched.
A transformers 4.x checkpoint trained with relative positions (config.json `position_embedding_type:
relative_key`, weights holding the distance tables) loads through `posbias.encoders` as such a
model, its tables copied in by `load_distance_embeddings`.
"""
from __future__ import annotations

import inspect
import math

import torch
from torch import nn

from .errors import ConfigError
from .precision import mask_min

RELATIVE_KINDS = ("relative_key", "relative_key_query")
SUPPORTED_MODELS = "BERT-style encoders with absolute position embeddings (bert, roberta, electra, ernie)"
# The call transformers 5.x's BertAttention makes: self.self(hidden_states, attention_mask=...,
# past_key_values=... (5.24 renamed it cache=...), encoder_hidden_states=..., **kwargs). A
# self-attention module whose forward takes anything else positionally (RoFormer's sinusoidal_pos,
# MPNet's position_bias) is not ours.
_BERT_CALL = ("hidden_states", "attention_mask", "past_key_values", "cache")


# The transformers releases the relative-position tests have passed on (README, "Compatibility").
# Swapping BertSelfAttention depends on how BertAttention calls it, which minor releases have
# changed (5.24 renamed past_key_values to cache), so a release outside this range is refused when
# relative attention is used, not when posbias is installed.
TESTED_TRANSFORMERS = ("5.4", "5.24")
ALLOW_UNTESTED = "POSBIAS_ALLOW_UNTESTED_TRANSFORMERS"


def check_transformers_version(key: str, installed: str | None = None) -> None:
    """Refuse, in one line naming `key`, a transformers release outside `TESTED_TRANSFORMERS`
    (unless the environment sets POSBIAS_ALLOW_UNTESTED_TRANSFORMERS=1)."""
    import os

    from packaging.version import Version

    if installed is None:
        import transformers

        installed = transformers.__version__
    low, high = TESTED_TRANSFORMERS
    v = Version(installed)
    if Version(low) <= v and (v.major, v.minor) <= Version(high).release[:2]:
        return
    if os.environ.get(ALLOW_UNTESTED) == "1":
        return
    raise ConfigError(f"{key}: relative position attention replaces BERT's attention modules and has been "
                      f"tested with transformers {low} to {high}.x; the installed transformers is {installed}. "
                      f"Run posbias's tests on it, then set {ALLOW_UNTESTED}=1 to use it")


def relative_kind(config) -> str | None:
    """`"relative_key"` or `"relative_key_query"` when the config asks for one, else None."""
    kind = getattr(config, "position_embedding_type", None)
    return kind if kind in RELATIVE_KINDS else None


def check_length(kind: str, max_position_embeddings: int, length: int) -> None:
    """The documented limit of relative attention: a ValueError for sequences longer than the
    distance table covers (4.x failed on them too; clamping would reuse the edge distance)."""
    if length > max_position_embeddings:
        raise ValueError(f"{kind} attention covers sequences of at most "
                         f"max_position_embeddings={max_position_embeddings} tokens, got {length}")


class _LengthCheck:
    """A forward pre-hook for the encoder's embeddings: `check_length` before the embeddings run.
    Without it, a too-long input fails inside transformers 5's embeddings (slicing their length-
    `max_position_embeddings` buffers of position and token-type ids) with a shape error. A class,
    not a closure, so a model holding it can still be pickled."""

    def __init__(self, config):
        self.config = config

    def __call__(self, module, args, kwargs):
        x = kwargs.get("input_ids", args[0] if args else None)
        if x is None:
            x = kwargs.get("inputs_embeds")
        if x is not None and x.dim() >= 2:  # (b, s) ids or (b, s, d) embeddings
            check_length(self.config.position_embedding_type, self.config.max_position_embeddings, x.shape[1])


# transformers 4.x's name of a relative distance table, under each BERT self-attention module.
DISTANCE_WEIGHT = "distance_embedding.weight"


def load_distance_embeddings(model: nn.Module, tensors: dict[str, torch.Tensor], source: str) -> list[str]:
    """Copy a transformers 4.x checkpoint's distance tables into `model`'s relative attention.

    Args:
        model: a patched encoder (`apply_relative_positions`), or a task model holding one.
        tensors: the checkpoint's `...attention.self.distance_embedding.weight` tensors by name, with
            or without the base model prefix (`bert.encoder.layer.0...` or `encoder.layer.0...`).
        source: the weights file, named in errors.

    Returns the names (`<module>.distance_embedding.weight`) of the tables the checkpoint lacks
    (they keep their random initialisation; the caller says so).

    Raises:
        ConfigError: a table whose shape differs from the one config.json describes, or a table no
            module of the model takes.
    """
    prefix = getattr(model, "base_model_prefix", "") + "."

    def bare(name: str) -> str:  # the name below the base model
        return name[len(prefix):] if prefix != "." and name.startswith(prefix) else name

    given = {bare(k): (k, v) for k, v in tensors.items()}
    missing, used = [], set()
    for name, module in model.named_modules():
        if not isinstance(module, RelativePositionSelfAttention):
            continue
        key = f"{bare(name)}.{DISTANCE_WEIGHT}"
        if key not in given:
            missing.append(f"{name}.{DISTANCE_WEIGHT}")
            continue
        file_key, weight = given[key]
        table = module.distance_embedding.weight
        if tuple(weight.shape) != tuple(table.shape):
            raise ConfigError(f"{source}: tensor {file_key} has shape {list(weight.shape)} but the model built from "
                              f"config.json needs {list(table.shape)} (2 * max_position_embeddings - 1 distances "
                              "by the attention head size): they are from different models")
        with torch.no_grad():
            table.copy_(weight.to(table.dtype))
        used.add(key)
    unused = sorted(given[k][0] for k in set(given) - used)
    if unused:
        raise ConfigError(f"{source}: tensor {unused[0]} belongs to no relative attention module of this model "
                          f"({len(unused)} such in all)")
    return missing


class NoPositionEmbeddings(nn.Module):
    """Stands in for `embeddings.position_embeddings`: zeros, so absolute positions no longer count.

    4.x's BertEmbeddings skipped the absolute table when position_embedding_type was relative;
    transformers 5's embeddings always add `self.position_embeddings(position_ids)`, so adding
    zeros is the least invasive way to get the same result for BERT, RoBERTa, ELECTRA and ERNIE.
    Holds no parameters (nothing in the state dict); a non-persistent empty buffer follows
    `.to()` / `.double()` so the zeros have the embeddings' dtype and device.
    """

    def __init__(self, num_embeddings: int, embedding_dim: int, dtype: torch.dtype, device: torch.device):
        super().__init__()
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.register_buffer("_like", torch.empty(0, dtype=dtype, device=device), persistent=False)

    def forward(self, position_ids: torch.Tensor) -> torch.Tensor:
        return self._like.new_zeros(*position_ids.shape, self.embedding_dim)

    def extra_repr(self) -> str:
        return f"zeros of width {self.embedding_dim}"


class RelativePositionSelfAttention(nn.Module):
    """Self-attention with learned relative position terms, computed eagerly as in transformers 4.x.

    Shaw et al. (2018), "Self-Attention with Relative Position Representations" (`relative_key`),
    and Huang et al. (2020), "Improve Transformer Models with Better Relative Position Embeddings"
    (`relative_key_query`). With a_ij = distance_embedding(i - j + max_position_embeddings - 1):

        relative_key:        e_ij = (q_i.k_j + q_i.a_ij) / sqrt(d)
        relative_key_query:  e_ij = (q_i.k_j + q_i.a_ij + k_j.a_ij) / sqrt(d)
        out_i = sum_j softmax_j(e_ij + mask_ij) v_j

    Shapes: b batch, h heads, l query positions, r key positions, d head size. Distances are
    counted by slot (i - j), not from `position_ids`, exactly as 4.x did: left padding therefore
    does not shift them, and shifted `position_ids` have no effect.

    The query/key/value/dropout submodules are the original module's, so pretrained weights
    load under the same keys. `config._attn_implementation` is not consulted for the
    arithmetic (no fused kernel takes these terms); it only changes the form of the mask the
    model hands in, which is normalised to an additive one (see `additive_mask`).

    Sequences longer than `max_position_embeddings` raise a ValueError instead of clamping the
    distances: 4.x failed on them too, and clamping would silently reuse the edge embedding for
    distances the model never trained on.

    Encoder-only: a key/value cache or cross-attention input raises. `output_attentions=True`
    does not collect these modules' weights (transformers records them by the original class);
    the weights are returned as the second output.
    """

    def __init__(self, attention: nn.Module, kind: str, max_position_embeddings: int,
                 initializer_range: float):
        super().__init__()
        if kind not in RELATIVE_KINDS:
            raise ValueError(f"kind must be one of {RELATIVE_KINDS}, got {kind!r}")
        self.position_embedding_type = kind
        self.num_attention_heads = attention.num_attention_heads
        self.attention_head_size = attention.attention_head_size
        self.all_head_size = self.num_attention_heads * self.attention_head_size
        self.max_position_embeddings = max_position_embeddings
        self.layer_idx = getattr(attention, "layer_idx", None)
        self.is_decoder, self.is_causal = False, False
        self.query, self.key, self.value, self.dropout = (attention.query, attention.key, attention.value,
                                                           attention.dropout)
        weight = attention.query.weight
        self.distance_embedding = nn.Embedding(2 * max_position_embeddings - 1, self.attention_head_size,
                                               device=weight.device, dtype=weight.dtype)
        with torch.no_grad():
            self.distance_embedding.weight.normal_(mean=0.0, std=initializer_range)

    def distance_embeddings(self, l: int, r: int, device, dtype) -> torch.Tensor:
        """(l, r, d) embeddings of the slot distances i - j."""
        n = self.max_position_embeddings
        check_length(self.position_embedding_type, n, max(l, r))
        distance = (torch.arange(l, device=device)[:, None] - torch.arange(r, device=device)[None, :])
        return self.distance_embedding(distance + n - 1).to(dtype)

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None,
                past_key_values=None, encoder_hidden_states: torch.Tensor | None = None,
                cache=None, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        """(b, l, h*d) attention output and (b, h, l, r) attention probabilities (after dropout)."""
        if encoder_hidden_states is not None:
            raise ValueError("relative position attention is self-attention only: cross-attention "
                             "(encoder_hidden_states) is not supported")
        if past_key_values is not None or cache is not None:
            raise ValueError("relative position attention is encoder-only: key/value caches are not "
                             "supported (pass use_cache=False)")
        input_shape = hidden_states.shape[:-1]
        hidden_shape = (*input_shape, -1, self.attention_head_size)
        q = self.query(hidden_states).view(hidden_shape).transpose(1, 2)  # (b, h, l, d)
        k = self.key(hidden_states).view(hidden_shape).transpose(1, 2)  # (b, h, r, d)
        v = self.value(hidden_states).view(hidden_shape).transpose(1, 2)  # (b, h, r, d)

        scores = torch.matmul(q, k.transpose(-1, -2))  # (b, h, l, r)
        e = self.distance_embeddings(q.shape[-2], k.shape[-2], q.device, q.dtype)  # (l, r, d)
        scores = scores + torch.einsum("bhld,lrd->bhlr", q, e)
        if self.position_embedding_type == "relative_key_query":
            scores = scores + torch.einsum("bhrd,lrd->bhlr", k, e)
        scores = scores / math.sqrt(self.attention_head_size)
        mask = additive_mask(attention_mask, scores.dtype)
        if mask is not None:
            scores = scores + mask

        probs = self.dropout(nn.functional.softmax(scores, dim=-1))
        out = torch.matmul(probs, v).transpose(1, 2).reshape(*input_shape, self.all_head_size)
        return out, probs

    def extra_repr(self) -> str:
        return f"position_embedding_type={self.position_embedding_type!r}"


def additive_mask(mask, dtype: torch.dtype) -> torch.Tensor | None:
    """The mask a transformers 5 model hands its attention, as 0 / `mask_min(dtype)` to add to scores.

    What arrives depends on `config._attn_implementation`: None (sdpa, no padding), a boolean
    (b, 1, l, r) mask with True = attend (sdpa), an additive float mask of 0 / min (eager), or
    the raw (b, r) 0/1 padding mask (flash attention). Adding a boolean mask to scores would
    silently add 1 to the attended keys, so every form is converted here.
    """
    if mask is None:
        return None
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"relative position attention cannot use a {type(mask).__name__} attention mask; "
                        "use attn_implementation 'sdpa' or 'eager'")
    if mask.dim() == 2:  # (b, r) padding mask, 1 = attend
        mask = mask[:, None, None, :] != 0
    if mask.dtype == torch.bool:
        zero = torch.zeros((), dtype=dtype, device=mask.device)
        return torch.where(mask, zero, mask_min(dtype))  # finite when autocast casts it to bf16
    if not mask.is_floating_point():  # an integer 4-D keep mask
        return additive_mask(mask != 0, dtype)
    return mask.to(dtype).clamp_min(mask_min(dtype))  # an fp32-min mask stays finite in bf16


def _is_bert_self_attention(module: nn.Module) -> bool:
    """Has BertSelfAttention's parts and takes BertAttention's call (see `_BERT_CALL`)."""
    if isinstance(module, RelativePositionSelfAttention):
        return True
    parts = all(isinstance(getattr(module, n, None), nn.Linear) for n in ("query", "key", "value"))
    if not (parts and isinstance(getattr(module, "dropout", None), nn.Dropout)
            and isinstance(getattr(module, "num_attention_heads", None), int)
            and isinstance(getattr(module, "attention_head_size", None), int)):
        return False
    params = list(inspect.signature(module.forward).parameters.values())
    named = [p.name for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    takes_kwargs = any(p.kind == p.VAR_KEYWORD for p in params)
    return takes_kwargs and named[:2] == ["hidden_states", "attention_mask"] and set(named) <= set(_BERT_CALL)


def apply_relative_positions(encoder: nn.Module, kind: str, key: str) -> None:
    """Switch a built encoder to relative position attention, in place.

    Every BERT-style self-attention module becomes a `RelativePositionSelfAttention` sharing its
    query/key/value weights, with a new `distance_embedding` drawn from N(0, initializer_range);
    `embeddings.position_embeddings` becomes `NoPositionEmbeddings`; the embeddings get a check
    that refuses inputs longer than the distance table (`check_length`) before they run; and
    `encoder.config.position_embedding_type = kind`, so a config.json saved from it rebuilds the
    same architecture. Applying it again only changes the kind (the weights are kept).

    Args:
        encoder: a transformers BertModel, RobertaModel, ElectraModel, ErnieModel or similar.
        kind: "relative_key" or "relative_key_query".
        key: the dotted config key the request came from, named in errors.

    Raises:
        ConfigError: unknown kind, or an encoder that is a decoder or has no absolute position
            table / BERT-style self-attention (GPT-2, BLOOM, RoFormer, ...).
    """
    config = encoder.config
    model_type = getattr(config, "model_type", type(encoder).__name__)
    check_transformers_version(key)
    if kind not in RELATIVE_KINDS:
        raise ConfigError(f"{key}: unknown relative position type {kind!r}; expected one of "
                          f"{', '.join(RELATIVE_KINDS)} (for {SUPPORTED_MODELS})")
    if getattr(config, "is_decoder", False):
        raise ConfigError(f"{key}: {kind} attention is for encoders, but the {model_type} config has "
                          f"is_decoder=True (supported: {SUPPORTED_MODELS})")
    embeddings = getattr(encoder, "embeddings", None)
    table = getattr(embeddings, "position_embeddings", None)
    targets = [name for name, m in encoder.named_modules() if name and _is_bert_self_attention(m)]
    if not isinstance(table, (nn.Embedding, NoPositionEmbeddings)) or not targets:
        raise ConfigError(f"{key}: {kind} attention is not available for model type {model_type!r}; "
                          f"supported: {SUPPORTED_MODELS}")

    for name in targets:
        parent_name, _, child = name.rpartition(".")
        parent = encoder.get_submodule(parent_name) if parent_name else encoder
        module = getattr(parent, child)
        if isinstance(module, RelativePositionSelfAttention):
            module.position_embedding_type = kind
        else:
            setattr(parent, child, RelativePositionSelfAttention(
                module, kind, config.max_position_embeddings, config.initializer_range))
    if isinstance(table, nn.Embedding):
        embeddings.position_embeddings = NoPositionEmbeddings(table.num_embeddings, table.embedding_dim,
                                                              table.weight.dtype, table.weight.device)
    if not getattr(embeddings, "_posbias_length_check", False):
        embeddings.register_forward_pre_hook(_LengthCheck(config), with_kwargs=True)
        embeddings._posbias_length_check = True
    config.position_embedding_type = kind
