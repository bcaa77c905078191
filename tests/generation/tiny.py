"""Tiny random causal LMs for the generation tests: a Gemma-3-style model (grouped-query attention,
sliding and full layers, q/k norms) and a Llama-style one, with the bundled byte-level BPE tokenizer,
wrapped as `posbias.generation.lm.LM`; a Llama written as a GGUF file as llama.cpp's converter writes one."""
from __future__ import annotations

import json
from pathlib import Path

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
    cfg = Gemma3TextConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                           num_attention_heads=4, num_key_value_heads=1, head_dim=8, max_position_embeddings=4096,
                           sliding_window=64, layer_types=["sliding_attention", "full_attention"] * 2,
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


def permute(w, n_head: int):
    """llama.cpp's reordering of Llama's q/k rows (convert_hf_to_gguf.py's LlamaModel.permute), which
    transformers undoes when it reads a llama GGUF."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


LLAMA_CPP_NAMES = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
                   "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
                   "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm",
                   "post_attention_layernorm": "ffn_norm"}


def write_gguf(path, model, tokenizer_file=Path(resolve_path(TOKENIZER)) / "tokenizer.json", arch: str = "llama") -> None:
    """`model` (a tiny LlamaForCausalLM) as llama.cpp writes a GGUF: F32 tensors under its names, the
    hyperparameters and a byte-level BPE tokenizer (tokens, merges, types, special ids) as metadata."""
    import gguf

    c = model.config
    spec = json.loads(tokenizer_file.read_text(encoding="utf-8"))
    vocab, merges = spec["model"]["vocab"], spec["model"]["merges"]
    tokens = sorted(vocab, key=vocab.get)
    special = {t["content"] for t in spec["added_tokens"] if t["special"]}
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name("tiny llama")
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_block_count(c.num_hidden_layers)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_rope_dimension_count(c.hidden_size // c.num_attention_heads)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_rope_freq_base(c.rope_parameters["rope_theta"])
    w.add_vocab_size(len(tokens))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    w.add_token_list(tokens)
    w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in merges])
    w.add_token_types([gguf.TokenType.CONTROL if t in special else gguf.TokenType.NORMAL for t in tokens])
    w.add_bos_token_id(vocab["<|endoftext|>"])
    w.add_eos_token_id(vocab["<|endoftext|>"])
    top = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
           "lm_head.weight": "output.weight"}
    for k, t in model.state_dict().items():
        a = t.float().numpy()
        if k in top:
            w.add_tensor(top[k], a)
            continue
        layer, part = k.split(".")[2], ".".join(k.split(".")[3:-1])
        if part == "self_attn.q_proj":
            a = permute(a, c.num_attention_heads)
        elif part == "self_attn.k_proj":
            a = permute(a, c.num_key_value_heads)
        w.add_tensor(f"blk.{layer}.{LLAMA_CPP_NAMES[part]}.weight", a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
