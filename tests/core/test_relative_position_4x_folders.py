"""transformers 4.x checkpoints trained with relative positions (issue 29, item 5).

A 4.x BERT folder whose config.json says `position_embedding_type: relative_key` (or
`relative_key_query`) and whose weights hold `...attention.self.distance_embedding.weight` (the
token-positional-bias paper's BERT_key / BERT_key-query) must load as that relative model, with
its trained distance tables: never silently as an absolute-position model. The folders are built
here in 4.x's layout (4.x key names, the persistent `embeddings.position_ids` buffer, a pooler, the
unused absolute table), and the loaded model is compared, in float64, with a transcription of 4.x's
BertModel forward written from its formula below.
"""
from __future__ import annotations

import json
import math
import warnings

import pytest
import torch
from safetensors.torch import load_file, save_file

from posbias.config import RESOURCES, ModelConfig
from posbias.errors import ConfigError

from helpers import relative_error

KINDS = ("relative_key", "relative_key_query")
N_POS = 40
TOL = 1e-10
ENCODER = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
               max_position_embeddings=N_POS, hidden_act="gelu", layer_norm_eps=1e-12, type_vocab_size=2,
               hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, initializer_range=0.2)


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(RESOURCES / "tiny_tokenizer"))


def write_4x_folder(folder, kind, tok, *, task=False, seed=0, state_edit=None, config_edit=None):
    """A transformers 4.x-layout folder: BertModel (or, `task`, BertForTokenClassification with the
    `bert.` prefix and 3 labels) weights under 4.x's names, distance tables N(0, 0.5) per layer."""
    from transformers import BertConfig, BertModel

    torch.manual_seed(seed)
    config = BertConfig(vocab_size=len(tok), pad_token_id=tok.pad_token_id, **ENCODER)
    state = {k: v.detach().clone() for k, v in BertModel(config, add_pooling_layer=True).state_dict().items()}
    g = torch.Generator().manual_seed(seed + 1)
    for i in range(ENCODER["num_hidden_layers"]):  # 4.x: nn.Embedding(2 * max_position_embeddings - 1, head size)
        state[f"encoder.layer.{i}.attention.self.distance_embedding.weight"] = 0.5 * torch.randn(
            2 * N_POS - 1, 8, generator=g)
    state["embeddings.position_ids"] = torch.arange(N_POS)[None]  # persistent in 4.x checkpoints
    d = {**config.to_dict(), "position_embedding_type": kind, "transformers_version": "4.30.2",
         "architectures": ["BertModel"]}
    if task:
        state = {f"bert.{k}": v for k, v in state.items() if not k.startswith("pooler")}
        state["classifier.weight"] = 0.2 * torch.randn(3, 32, generator=g)
        state["classifier.bias"] = torch.zeros(3)
        d.update(architectures=["BertForTokenClassification"], id2label={0: "O", 1: "B-loc", 2: "I-loc"},
                 label2id={"O": 0, "B-loc": 1, "I-loc": 2})
    if state_edit:
        state_edit(state)
    if config_edit:
        config_edit(d)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(d), encoding="utf-8")
    save_file({k: v.contiguous() for k, v in state.items()}, str(folder / "model.safetensors"),
              metadata={"format": "pt"})
    tok.save_pretrained(str(folder))
    return folder


# --- transformers 4.x's BertModel forward, transcribed from its formula (float64) ------------------

def layer_norm(x, w, b, eps):
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt(var + eps) * w + b


def bert_4x_forward(state: dict, kind: str, input_ids, attention_mask, prefix: str = "") -> torch.Tensor:
    """last_hidden_state of 4.x's BertModel with position_embedding_type `kind`, from the weights.

    4.x (modeling_bert.py): the embeddings add word and token-type (0) embeddings but not the
    absolute table (`if self.position_embedding_type == "absolute"`), then LayerNorm. Each self-
    attention, with a_lr = distance_embedding(l - r + max_position_embeddings - 1):
        relative_key:       scores = q.k + einsum("bhld,lrd->bhlr", q, a)
        relative_key_query: scores = q.k + einsum(q, a) + einsum("bhrd,lrd->bhlr", k, a)
        probs = softmax(scores / sqrt(d) + (1 - mask) * finfo.min)
    then dense + residual + LayerNorm, gelu(dense), dense + residual + LayerNorm.
    """
    w = {k[len(prefix):]: v.double() for k, v in state.items() if k.startswith(prefix)}
    eps, h, d = ENCODER["layer_norm_eps"], ENCODER["num_attention_heads"], 8
    b, s = input_ids.shape
    x = w["embeddings.word_embeddings.weight"][input_ids] + w["embeddings.token_type_embeddings.weight"][0]
    x = layer_norm(x, w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"], eps)  # (b, s, 32)
    mask = (1.0 - attention_mask.double())[:, None, None, :] * torch.finfo(torch.float64).min  # (b, 1, 1, s)
    distance = torch.arange(s)[:, None] - torch.arange(s)[None, :]  # (l, r): l - r
    for i in range(ENCODER["num_hidden_layers"]):
        p = f"encoder.layer.{i}."

        def lin(name, t):
            return t @ w[p + name + ".weight"].T + w[p + name + ".bias"]

        def heads(t):  # (b, s, h*d) -> (b, h, s, d)
            return t.view(b, s, h, d).transpose(1, 2)

        q, k, v = (heads(lin(f"attention.self.{n}", x)) for n in ("query", "key", "value"))
        a = w[p + "attention.self.distance_embedding.weight"][distance + N_POS - 1]  # (l, r, d)
        scores = q @ k.transpose(-1, -2) + torch.einsum("bhld,lrd->bhlr", q, a)
        if kind == "relative_key_query":
            scores = scores + torch.einsum("bhrd,lrd->bhlr", k, a)
        probs = torch.softmax(scores / math.sqrt(d) + mask, dim=-1)
        ctx = (probs @ v).transpose(1, 2).reshape(b, s, h * d)
        x = layer_norm(lin("attention.output.dense", ctx) + x, w[p + "attention.output.LayerNorm.weight"],
                       w[p + "attention.output.LayerNorm.bias"], eps)
        inter = torch.nn.functional.gelu(lin("intermediate.dense", x))  # 4.x "gelu": the erf form
        x = layer_norm(lin("output.dense", inter) + x, w[p + "output.LayerNorm.weight"],
                       w[p + "output.LayerNorm.bias"], eps)
    return x


def batch(tok, n=3, s=12, seed=3):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, len(tok), (n, s), generator=g)
    mask = torch.ones(n, s, dtype=torch.long)
    mask[1, 8:] = 0  # a padded row
    ids[1, 8:] = tok.pad_token_id
    return ids, mask


# --- tests -------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", KINDS)
def test_4x_folder_loads_as_its_relative_model(kind, tok, tmp_path):
    """posbias's encoder loading (model.name_or_path) of a 4.x relative_key(_query) BertModel folder
    gives 4.x's outputs; transformers 5 alone (what posbias did before) gives an absolute model."""
    from transformers import AutoModel

    from posbias.encoders import load_encoder
    from posbias.relative_position import RelativePositionSelfAttention

    folder = write_4x_folder(tmp_path / kind, kind, tok)
    state = load_file(str(folder / "model.safetensors"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing is missing: no "start random" warning
        encoder = load_encoder(ModelConfig(name_or_path=str(folder)), tok).double().eval()
    assert encoder.config.position_embedding_type == kind
    assert sum(isinstance(m, RelativePositionSelfAttention) for m in encoder.modules()) == 2
    for i in range(2):
        assert torch.equal(encoder.encoder.layer[i].attention.self.distance_embedding.weight,
                           state[f"encoder.layer.{i}.attention.self.distance_embedding.weight"].double())
    ids, mask = batch(tok)
    expected = bert_4x_forward(state, kind, ids, mask)
    with torch.no_grad():
        got = encoder(input_ids=ids, attention_mask=mask).last_hidden_state
    err = relative_error(got, expected)
    assert err <= TOL, err

    # A deliberately wrong model fails the same check: the folder as transformers 5 loads it.
    plain = AutoModel.from_pretrained(str(folder), add_pooling_layer=False).double().eval()
    with torch.no_grad():
        wrong = plain(input_ids=ids, attention_mask=mask).last_hidden_state
    assert relative_error(wrong, expected) > 1e-3
    # ... and so does the 4.x formula with the other kind's score terms.
    other = bert_4x_forward(state, KINDS[1 - KINDS.index(kind)], ids, mask)
    assert relative_error(other, expected) > 1e-3


@pytest.mark.parametrize("kind", KINDS)
def test_4x_task_folder_evaluates_and_its_checkpoint_reloads(kind, tok, tmp_path):
    """A 4.x BertForTokenClassification folder (`bert.` prefix) opens as a posbias tagger with 4.x's
    logits; the posbias checkpoint saved from it reloads (it used to fail: an absolute-table state
    under a relative config.json) and gives the same logits."""
    from posbias.checkpoint import load_checkpoint, save_checkpoint

    folder = write_4x_folder(tmp_path / kind, kind, tok, task=True)
    state = load_file(str(folder / "model.safetensors"))
    model, tokenizer, cfg = load_checkpoint(str(folder), task="tagging")
    model = model.double().eval()
    assert model.encoder.config.position_embedding_type == kind
    ids, mask = batch(tok)
    batch_ = {"input_ids": ids, "attention_mask": mask}
    hidden = bert_4x_forward(state, kind, ids, mask, prefix="bert.")
    expected = hidden @ state["classifier.weight"].double().T + state["classifier.bias"].double()
    with torch.no_grad():
        logits = model(batch_)["logits"]
    assert relative_error(logits, expected) <= TOL

    save_checkpoint(model.float(), cfg, tokenizer, tmp_path / "ckpt")
    again, _, _ = load_checkpoint(str(tmp_path / "ckpt"), task="tagging")
    assert again.encoder.config.position_embedding_type == kind
    with torch.no_grad():
        reloaded = again.double().eval()(batch_)["logits"]
    assert relative_error(reloaded, expected) <= 1e-6  # through one float32 save


def test_4x_training_encoder_checkpoint_reloads(tok, tmp_path):
    """The training path: a tagger built on a 4.x relative_key encoder (model.name_or_path), saved,
    reloads with the same distance tables and logits (config.json says relative; weights agree)."""
    from posbias.checkpoint import load_checkpoint, save_checkpoint
    from posbias.config import config_from
    from posbias.tagging.model import build_model

    folder = write_4x_folder(tmp_path / "enc", "relative_key", tok)
    cfg = config_from("tiny_tagging", [f"model.name_or_path={folder}", "model.encoder=null", "model.tokenizer=null"])
    model = build_model(cfg.model, tok, ["O", "B-loc", "I-loc"], "iob2").eval()
    save_checkpoint(model, cfg, tok, tmp_path / "ckpt")
    again, _, _ = load_checkpoint(str(tmp_path / "ckpt"), task="tagging")
    ids, mask = batch(tok)
    with torch.no_grad():
        a = model({"input_ids": ids, "attention_mask": mask})["logits"]
        b = again.eval()({"input_ids": ids, "attention_mask": mask})["logits"]
    assert torch.equal(a, b)


def test_4x_pytorch_bin_folder_loads(tok, tmp_path):
    """4.x's other weight file, pytorch_model.bin, gives the same tables."""
    from posbias.encoders import load_encoder

    folder = write_4x_folder(tmp_path / "bin", "relative_key_query", tok)
    state = load_file(str(folder / "model.safetensors"))
    torch.save(state, str(folder / "pytorch_model.bin"))
    (folder / "model.safetensors").unlink()
    encoder = load_encoder(ModelConfig(name_or_path=str(folder)), tok)
    assert torch.equal(encoder.encoder.layer[1].attention.self.distance_embedding.weight,
                       state["encoder.layer.1.attention.self.distance_embedding.weight"])


def test_inconsistent_4x_folders_are_refused_by_name(tok, tmp_path):
    from posbias.encoders import load_encoder

    # Distance tables under an absolute config.json: loading them as absolute is another model.
    absolute = write_4x_folder(tmp_path / "abs", "relative_key", tok,
                               config_edit=lambda d: d.update(position_embedding_type="absolute"))
    with pytest.raises(ConfigError, match=r"^model\.name_or_path: .*relative position tables "
                                          r"\(encoder\.layer\.\d\.attention\.self\.distance_embedding\.weight"):
        load_encoder(ModelConfig(name_or_path=str(absolute)), tok)
    # A table of another size than config.json's max_position_embeddings gives.
    def shrink(state):
        state["encoder.layer.0.attention.self.distance_embedding.weight"] = torch.zeros(2 * 20 - 1, 8)
    wrong = write_4x_folder(tmp_path / "shape", "relative_key", tok, state_edit=shrink)
    with pytest.raises(ConfigError, match=r"tensor encoder\.layer\.0\.attention\.self\.distance_embedding\.weight "
                                          r"has shape \[39, 8\] but the model built from config\.json needs \[79, 8\]"):
        load_encoder(ModelConfig(name_or_path=str(wrong)), tok)
    # Asking for an absolute model of a relative folder: its absolute table was never trained.
    rel = write_4x_folder(tmp_path / "rel", "relative_key", tok)
    with pytest.raises(ConfigError, match=r"^model\.position_embedding_type: absolute, but .* relative_key"):
        load_encoder(ModelConfig(name_or_path=str(rel), position_embedding_type="absolute"), tok)


def test_relative_config_without_tables_warns(tok, tmp_path):
    """A relative config.json whose weights lack the tables: they start random, and the warning says so."""
    from posbias.encoders import load_encoder

    def drop(state):
        del state["encoder.layer.1.attention.self.distance_embedding.weight"]
    folder = write_4x_folder(tmp_path / "drop", "relative_key", tok, state_edit=drop)
    with pytest.warns(UserWarning, match=r"1 weight\(s\) are not in .* start random: "
                                         r"encoder\.layer\.1\.attention\.self\.distance_embedding\.weight"):
        load_encoder(ModelConfig(name_or_path=str(folder)), tok)
