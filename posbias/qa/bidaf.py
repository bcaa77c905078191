"""A BiDAF backbone (Seo et al., 2017, "Bidirectional Attention Flow for Machine Comprehension"),
so the MaP paper's BiDAF group (VCP vs MaP_F vs MaP_E, Table 1) can run on the same heads and loop.

    model:
      name_or_path: null
      tokenizer: minilm                     # any WordPiece tokenizer with token types
      encoder: {model_type: bidaf, hidden_size: 200, embedding_init: minilm}

Layers (the paper's §2, up to its modeling layer; the heads replace its output layer):
  1. word embeddings of the word pieces, initialised from a local encoder's input table
     (`embedding_init`, e.g. `minilm`; frozen by default, as BiDAF keeps GloVe fixed) or random.
     No GloVe vectors and no character CNN: nothing can be downloaded here, and word pieces already
     cover the character level. A 2-layer highway network follows, as in the paper.
  2. contextual layer: one BiLSTM, run separately over the question and the context.
  3. attention flow: S_ij = w_Sᵀ[c_i; q_j; c_i ∘ q_j]; context-to-query ã_i = Σ_j softmax_j(S_ij) q_j;
     query-to-context h̃ = Σ_i softmax_i(max_j S_ij) c_i; G_i = [c_i; ã_i; c_i ∘ ã_i; c_i ∘ h̃].
  4. modeling layer: a 2-layer BiLSTM over G.
The output (b, s, hidden_size) holds the modeling layer's states at context tokens and the
contextual states at question tokens (which the conditional heads pool, MaP Eq. 5-6).
The question is every real token of token type 0 ([CLS] question [SEP]), the context every token of
type 1 (context [SEP]). There are no position embeddings: position shifts do nothing here.

Shape legend: b batch, s sequence, m question tokens, n context tokens, E embedding, h = hidden/2.
"""
from __future__ import annotations

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence
from transformers import AutoConfig, AutoModel, PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import BaseModelOutput

from ..config import resolve_path
from ..encoders import from_pretrained_quietly, local_dir
from ..errors import ConfigError


class BidafConfig(PretrainedConfig):
    model_type = "bidaf"

    def __init__(self, vocab_size: int = 30522, embedding_size: int = 128, hidden_size: int = 200,
                 dropout: float = 0.2, freeze_embeddings: bool = True, embedding_init: str | None = None,
                 pad_token_id: int = 0, **kwargs):
        super().__init__(pad_token_id=pad_token_id, **kwargs)
        if hidden_size % 2:
            raise ConfigError(f"model.encoder.hidden_size must be even for BiDAF (two LSTM directions), got {hidden_size}")
        self.vocab_size, self.embedding_size, self.hidden_size = vocab_size, embedding_size, hidden_size
        self.dropout, self.freeze_embeddings, self.embedding_init = dropout, freeze_embeddings, embedding_init


class Highway(nn.Module):
    def __init__(self, size: int, layers: int = 2):
        super().__init__()
        self.transform = nn.ModuleList(nn.Linear(size, size) for _ in range(layers))
        self.gate = nn.ModuleList(nn.Linear(size, size) for _ in range(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for t, g in zip(self.transform, self.gate):
            gate = torch.sigmoid(g(x))
            x = gate * torch.relu(t(x)) + (1 - gate) * x
        return x


def _run_lstm(lstm: nn.LSTM, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    packed = pack_padded_sequence(x, lengths.cpu(), batch_first=True, enforce_sorted=False)
    out, _ = lstm(packed)
    return pad_packed_sequence(out, batch_first=True, total_length=x.shape[1])[0]


def _segment(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(b, s) bool -> (indices (b, k) of the True positions, left-aligned and padded with 0; lengths (b,))."""
    lengths = mask.sum(1)
    order = torch.argsort((~mask).to(torch.int8), dim=1, stable=True)  # True positions first, in order
    return order[:, : int(lengths.max())], lengths


class BidafModel(PreTrainedModel):
    config_class = BidafConfig
    base_model_prefix = "bidaf"

    def __init__(self, config: BidafConfig):
        super().__init__(config)
        h, e = config.hidden_size // 2, config.embedding_size
        self.embeddings = nn.Embedding(config.vocab_size, e, padding_idx=config.pad_token_id)
        self.embeddings.weight.requires_grad_(not config.freeze_embeddings)
        self.highway = Highway(e)
        self.contextual = nn.LSTM(e, h, batch_first=True, bidirectional=True)
        self.w_c, self.w_q, self.w_cq = nn.Linear(2 * h, 1), nn.Linear(2 * h, 1, bias=False), nn.Parameter(torch.zeros(2 * h))
        self.modeling = nn.LSTM(8 * h, h, num_layers=2, batch_first=True, bidirectional=True, dropout=config.dropout)
        self.dropout = nn.Dropout(config.dropout)
        self.post_init()

    def init_new_weights(self) -> None:
        """Called once when a fresh encoder is built for training (not when a checkpoint loads)."""
        if self.config.embedding_init:
            _init_embeddings(self, self.config.embedding_init)

    def get_input_embeddings(self):
        return self.embeddings

    def set_input_embeddings(self, value):
        self.embeddings = value

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, **kwargs) -> BaseModelOutput:
        if token_type_ids is None:
            raise ConfigError("the BiDAF encoder needs token_type_ids to tell question (0) from context (1): "
                              "use a tokenizer with token types (BERT WordPiece)")
        real = attention_mask.bool() if attention_mask is not None else torch.ones_like(input_ids, dtype=torch.bool)
        x = self.dropout(self.highway(self.embeddings(input_ids)))  # (b, s, E)
        q_idx, q_len = _segment(real & (token_type_ids == 0))  # (b, m)
        c_idx, c_len = _segment(real & (token_type_ids == 1))  # (b, n)
        if (q_len == 0).any() or (c_len == 0).any():
            raise ConfigError("BiDAF: a window without question or context tokens (token types 0 / 1)")
        gather = lambda t, idx: t.gather(1, idx[:, :, None].expand(-1, -1, t.shape[-1]))  # noqa: E731
        q = self.dropout(_run_lstm(self.contextual, gather(x, q_idx), q_len))  # (b, m, 2h)
        c = self.dropout(_run_lstm(self.contextual, gather(x, c_idx), c_len))  # (b, n, 2h)
        q_ok = torch.arange(q.shape[1], device=q.device) < q_len[:, None]  # (b, m)
        c_ok = torch.arange(c.shape[1], device=c.device) < c_len[:, None]  # (b, n)
        # S_ij = w_Sᵀ[c_i; q_j; c_i ∘ q_j], split so that no (b, n, m, 6h) tensor is built.
        sim = self.w_c(c) + self.w_q(q).transpose(1, 2) + (c * self.w_cq) @ q.transpose(1, 2)  # (b, n, m)
        neg = torch.finfo(sim.dtype).min
        c2q = sim.masked_fill(~q_ok[:, None, :], neg).softmax(-1) @ q  # (b, n, 2h)
        b_att = sim.masked_fill(~q_ok[:, None, :], neg).amax(-1).masked_fill(~c_ok, neg).softmax(-1)  # (b, n)
        q2c = torch.einsum("bn,bnd->bd", b_att, c)[:, None, :].expand_as(c)  # (b, n, 2h)
        g = torch.cat([c, c2q, c * c2q, c * q2c], -1)  # (b, n, 8h)
        m = _run_lstm(self.modeling, g, c_len)  # (b, n, 2h)
        # Back to the window's positions: modeling states at context tokens, contextual ones at question tokens.
        out = x.new_zeros(x.shape[0], x.shape[1], self.config.hidden_size)
        for idx, ok, states in ((c_idx, c_ok, m), (q_idx, q_ok, q)):
            rows, slots = ok.nonzero(as_tuple=True)
            out = out.index_put((rows, idx[rows, slots]), states[rows, slots])
        return BaseModelOutput(last_hidden_state=out)


AutoConfig.register("bidaf", BidafConfig)
AutoModel.register(BidafConfig, BidafModel)


def _init_embeddings(model: BidafModel, spec: str) -> None:
    """Copy a local encoder's word-piece embedding table (`embedding_init`) into the BiDAF model."""
    path = local_dir(resolve_path(spec), "model.encoder.embedding_init")
    source = from_pretrained_quietly(AutoModel, path, "model.encoder.embedding_init").get_input_embeddings().weight
    table = model.embeddings.weight
    if source.shape != table.shape:
        raise ConfigError(f"model.encoder.embedding_init: {path} has a {tuple(source.shape)} embedding table, the "
                          f"BiDAF encoder {tuple(table.shape)}; set model.encoder.embedding_size to {source.shape[1]} "
                          "and use that model's tokenizer")
    with torch.no_grad():
        table.copy_(source)
