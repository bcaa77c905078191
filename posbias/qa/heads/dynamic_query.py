"""DyReF, dynamic start/end queries fed through the encoder (Zaratiana et al., "DyReF: Extractive
Question Answering with Dynamic Query Representation for Free"), §3 and §7.1.

    [q_s^L, q_e^L, h_1 .. h_N] = Trans_L([q_s^0, q_e^0, h_1^0 .. h_N^0])         Eq. 3
    p(start = i) = exp(q_s^fᵀ h_i) / Σ_{i'=1..N} exp(q_s^fᵀ h_i')               Eq. 1 with q^f
    (p(end = j) likewise with q_e^f)

- The two initial queries (N(0, 0.02), §3.1) are the head's only parameters. They are *prepended*
  to the token embeddings, as in the authors' code (github urchade/DyREF, dyref.py): they take
  positions 0 and 1, every token moves by 2, query token type 0. So data.max_seq_len + 2 (plus the
  first position id, for RoBERTa) must fit the position table. Random Padding and RPP shift the
  tokens after [CLS] only; the queries keep their positions.
- The queries live where the word embeddings do (h_i^0 of §3.1): they are as wide as the encoder's
  input embeddings, which for ELECTRA-small or ALBERT (embedding_size < hidden_size) are narrower
  than the hidden states; the encoder's own projection then maps them, like every token, to the
  hidden size. (The authors' code sizes them to the hidden size, which only fits BERT and RoBERTa.)
- `softmax_over` (Eq. 1's normalisation, in the loss): `all` (default) sums over all N input
  tokens, [CLS] and question included, padding excluded, as Eq. 1 and dyref.py (which masks only
  padding); `context` over the context only (plus [CLS] for SQuAD v2), posbias's behaviour before
  the option existed. Decoding is the same under both: spans lie in the context.
- Final queries (`query_pooling`, §3.2): `last` (Eq. 4), `mean` (Eq. 5) or `max` (Eq. 6) over the
  transformer layers' outputs at the query slots; the embedding layer is excluded.
- Attention masks (`attention`, §7.1, Fig. 2), as additive float masks (0 / dtype min): a boolean
  4-D mask is not applied by eager attention in transformers 5 (it is *added* to the scores).
    full           everything attends to everything (padding excluded)
    bidirectional  tokens do not attend to the queries; the queries see each other
    causal         as bidirectional, and the start query does not see the end query
    independent    as bidirectional, and the queries do not see each other
- The head replaces the plain encoder call (`encode`), so export to AutoModelForQuestionAnswering
  is impossible; the posbias checkpoint holds the queries.

Shape legend: b batch, s tokens, S = s + 2 encoder positions, e input embedding width, d hidden,
L layers.
"""
from __future__ import annotations

import torch
from torch import nn

from ...encoders import position_ids
from ...errors import ConfigError
from ...precision import mask_min
from ...registry import HEADS
from .pointer import cross_entropy, upcast
from .span_scores import AdditiveSpans, check_softmax_over, masked_logits, softmax_mask

N_QUERIES = 2
POOLINGS = ("last", "mean", "max")
ATTENTION = ("full", "bidirectional", "causal", "independent")


def query_attention_mask(attention_mask: torch.Tensor, kind: str, dtype: torch.dtype) -> torch.Tensor:
    """(b, 1, S, S) additive mask for [q_s, q_e, tokens]: 0 where row may attend to column, min else.

    Args:
        attention_mask: (b, s) 1 for real tokens.
        kind: one of ATTENTION.
    """
    b, s = attention_mask.shape
    keys = torch.cat([attention_mask.new_ones(b, N_QUERIES), attention_mask], 1).bool()  # (b, S)
    allowed = keys[:, None, :].expand(b, s + N_QUERIES, s + N_QUERIES).clone()  # (b, S, S) [row, col]
    if kind != "full":
        allowed[:, N_QUERIES:, :N_QUERIES] = False  # tokens do not attend to the queries
    if kind == "causal":
        allowed[:, 0, 1] = False  # the start query does not see the end query
    if kind == "independent":
        allowed[:, 0, 1] = allowed[:, 1, 0] = False
    zero = torch.zeros((), dtype=dtype, device=attention_mask.device)
    neg = torch.tensor(mask_min(dtype), dtype=dtype, device=attention_mask.device)  # finite in bf16 too
    return torch.where(allowed, zero, neg)[:, None]


class DynamicQueryHead(AdditiveSpans, nn.Module):
    position_offset = N_QUERIES  # token position ids move by 2 (checked against the position table)

    def __init__(self, hidden_size: int, null_answer: bool = False, query_pooling: str = "mean",
                 attention: str = "full", softmax_over: str = "all", embedding_size: int | None = None):
        """`embedding_size`: width of the encoder's input embeddings, where the queries enter
        (default `hidden_size`)."""
        super().__init__()
        if query_pooling not in POOLINGS:
            raise ConfigError(f"model.head_options.query_pooling must be one of {list(POOLINGS)}, got {query_pooling!r}")
        if attention not in ATTENTION:
            raise ConfigError(f"model.head_options.attention must be one of {list(ATTENTION)}, got {attention!r}")
        self.null_answer = null_answer
        self.query_pooling = query_pooling
        self.attention = attention
        self.softmax_over = check_softmax_over(softmax_over)
        width = embedding_size or hidden_size
        self.queries = nn.Parameter(torch.randn(N_QUERIES, width) * 0.02)  # q_s^0, q_e^0 (2, e)

    # --------------------------------------------------------------------------- through the encoder
    def encoder_position_ids(self, inputs, batch: dict) -> torch.Tensor:
        """(b, S) position ids of [q_s, q_e, tokens]: the queries take the first two, every real token
        moves by 2 (its own id, or a perturbation's shifted one), padding keeps the pad id."""
        mask = batch["attention_mask"]
        b = mask.shape[0]
        pos = batch.get("position_ids")
        if pos is None:
            pos = position_ids(mask, inputs.base, inputs.pad)  # (b, s)
        pos = torch.where(mask.bool(), pos + N_QUERIES, pos)  # tokens move by 2, padding keeps its id
        query_pos = inputs.base + torch.arange(N_QUERIES, device=mask.device).expand(b, -1)  # (b, 2)
        return torch.cat([query_pos, pos], 1)

    def encoder_kwargs(self, encoder, inputs, batch: dict) -> dict:
        """The encoder's keyword arguments for [q_s, q_e, tokens] (Eq. 3's input)."""
        ids, mask = batch["input_ids"], batch["attention_mask"]
        b = ids.shape[0]
        tokens = encoder.get_input_embeddings()(ids)  # (b, s, e), e the embedding width
        embeds = torch.cat([self.queries.to(tokens.dtype)[None].expand(b, -1, -1), tokens], 1)  # (b, S, e)
        if self.attention == "full":
            # Nothing beyond padding is blocked: the plain (b, S) mask lets the encoder take the same
            # attention path as for any other head (equal to the 4-D mask; tested).
            attn = torch.cat([mask.new_ones(b, N_QUERIES), mask], 1)
        else:
            attn = query_attention_mask(mask, self.attention, embeds.dtype)
        kwargs = {"inputs_embeds": embeds, "attention_mask": attn,
                  "output_hidden_states": self.query_pooling != "last"}
        if inputs.positions:
            kwargs["position_ids"] = self.encoder_position_ids(inputs, batch)
        if inputs.types and "token_type_ids" in batch:
            kwargs["token_type_ids"] = torch.cat([batch["token_type_ids"].new_zeros(b, N_QUERIES),
                                                  batch["token_type_ids"]], 1)
        return kwargs

    def encode(self, encoder, inputs, batch: dict) -> dict:
        """Run the encoder on [q_s, q_e, tokens]: token states (b, s, d) and final queries (b, 2, d)."""
        out = encoder(**self.encoder_kwargs(encoder, inputs, batch))
        if self.query_pooling == "last":
            return {"tokens": out.last_hidden_state[:, N_QUERIES:], "queries": out.last_hidden_state[:, :N_QUERIES]}  # Eq. 4
        layers = torch.stack([h[:, :N_QUERIES] for h in out.hidden_states[1:]], 0)  # (L, b, 2, d), no embeddings
        if self.query_pooling == "mean":
            queries = layers.mean(0)  # Eq. 5
        else:
            queries = layers.amax(0)  # Eq. 6
        return {"tokens": out.last_hidden_state[:, N_QUERIES:], "queries": queries}

    def forward(self, encoded: dict, batch: dict, targets: dict | None = None) -> dict:
        logits = torch.einsum("bsd,bqd->bsq", encoded["tokens"], encoded["queries"])  # (b, s, 2)
        mask = softmax_mask(batch, self.softmax_over, self.null_answer)  # (b, s): Eq. 1's i' = 1..N
        start, end = (masked_logits(upcast(x), mask) for x in logits.unbind(-1))
        out = {"start_logits": start, "end_logits": end}
        if targets is not None:
            out["loss"] = (cross_entropy(start, targets["start_positions"])
                           + cross_entropy(end, targets["end_positions"])) / 2
        return out


@HEADS.register("dynamic_query", debias=True)
def dynamic_query(hidden_size: int, null_answer: bool = False, query_pooling: str = "mean",
                  attention: str = "full", softmax_over: str = "all", *,
                  embedding_size: int | None = None) -> DynamicQueryHead:
    return DynamicQueryHead(hidden_size, null_answer, query_pooling, attention, softmax_over, embedding_size)
