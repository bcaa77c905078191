"""Tiny random causal LMs for the generation tests: a Gemma-3-style model (grouped-query attention,
sliding and full layers, q/k norms) and a Llama-style one, with the bundled byte-level BPE tokenizer,
wrapped as `posbias.generation.lm.LM`."""
from __future__ import annotations

import torch
from transformers import Gemma3ForCausalLM, Gemma3TextConfig, LlamaConfig, LlamaForCausalLM

from posbias.config import resolve_path
from posbias.encoders import open_tokenizer
from posbias.generation.lm import LM
from posbias.precision import resolve_precision

TOKENIZER = "posbias/resources/tiny_bpe_gpt2"


def tokenizer():
    tok = open_tokenizer(str(resolve_path(TOKENIZER)))
    tok.padding_side = "left"
    return tok


def gemma(tok, seed: int = 0, dtype=torch.float32):
    torch.manual_seed(seed)
    cfg = Gemma3TextConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                           num_attention_heads=4, num_key_value_heads=1, head_dim=8, max_position_embeddings=4096,
                           sliding_window=64, layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                           pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    return Gemma3ForCausalLM(cfg).to(dtype).eval()


def llama(tok, seed: int = 0, dtype=torch.float32):
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                      pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    return LlamaForCausalLM(cfg).to(dtype).eval()


def wrap(model, tok, name: str = "tiny-gemma") -> LM:
    dev = torch.device("cpu")
    return LM(source=name, folder="(in memory)", kind="tiny random model", model=model, tokenizer=tok, device=dev,
              precision=resolve_precision("fp32", dev, "--precision"), context_length=4096, chat_template=False,
              fingerprint=f"{name}-{sum(float(p.detach().sum()) for p in model.parameters()):.6f}")
