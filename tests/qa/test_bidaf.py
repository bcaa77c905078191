"""The BiDAF backbone (`model.encoder: {model_type: bidaf}`): attention flow against its formula,
question/context separation, embeddings from a local model, and train -> save -> reload -> evaluate."""
import json

import numpy as np
import pytest
import torch

import posbias
from posbias.config import build_config
from posbias.errors import ConfigError
from posbias.qa.bidaf import BidafConfig, BidafModel
from posbias.qa.collate import collate
from posbias.qa.features import build_qa_features
from posbias.qa.model import build_model

from helpers import DEMO_DEV, tiny_config

BIDAF = {"model_type": "bidaf", "hidden_size": 16, "embedding_size": 8, "dropout": 0.0}


@pytest.fixture(scope="module")
def batch(tokenizer, dev_examples):
    feats = build_qa_features(dev_examples[:6], tokenizer, max_seq_len=96, stride=32, max_query_len=24,
                              train=True, version=1)
    return collate(feats, np.arange(4), pad_id=0)


def bidaf_model(tokenizer, head="conditional_pointer", encoder=None, seed=0):
    torch.manual_seed(seed)
    cfg = build_config(tiny_config(model={"head": head, "encoder": {**BIDAF, **(encoder or {})}}))
    return build_model(cfg.model, tokenizer, null_answer=False).eval()


def test_question_states_ignore_the_context_and_context_states_read_the_question(tokenizer, batch):
    model = bidaf_model(tokenizer)
    enc = model.encoder
    q = batch["attention_mask"].bool() & (batch["token_type_ids"] == 0)
    c = batch["attention_mask"].bool() & (batch["token_type_ids"] == 1)
    with torch.no_grad():
        ref = enc(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"]).last_hidden_state
        ids = batch["input_ids"].clone()
        ids[c] = 1000 + ids[c] % 50  # change every context token
        other_c = enc(ids, batch["attention_mask"], batch["token_type_ids"]).last_hidden_state
        ids = batch["input_ids"].clone()
        ids[q & (ids > 3)] = 1000  # change the question words (not [CLS]/[SEP])
        other_q = enc(ids, batch["attention_mask"], batch["token_type_ids"]).last_hidden_state
    assert ref.shape == (*batch["input_ids"].shape, 16)
    torch.testing.assert_close(other_c[q], ref[q])  # the question LSTM never sees the context
    assert not torch.allclose(other_q[c], ref[c])  # the context reads the question (attention flow)
    assert (ref[~batch["attention_mask"].bool()] == 0).all()  # padding stays zero


def test_attention_flow_matches_the_concatenation_formula():
    """S_ij = w_Sᵀ[c_i; q_j; c_i ∘ q_j] computed with the 6h concatenation vs the split form."""
    torch.manual_seed(1)
    model = BidafModel(BidafConfig(vocab_size=20, embedding_size=4, hidden_size=6)).double()
    c, q = torch.randn(2, 5, 6, dtype=torch.float64), torch.randn(2, 3, 6, dtype=torch.float64)
    w = torch.cat([model.w_c.weight[0], model.w_q.weight[0], model.w_cq])  # (6h)
    cat = torch.cat([c[:, :, None].expand(2, 5, 3, 6), q[:, None].expand(2, 5, 3, 6),
                     c[:, :, None] * q[:, None]], -1)  # (b, n, m, 6h)
    naive = cat @ w + model.w_c.bias
    split = model.w_c(c) + model.w_q(q).transpose(1, 2) + (c * model.w_cq) @ q.transpose(1, 2)
    torch.testing.assert_close(split, naive, rtol=1e-12, atol=1e-12)


def test_embeddings_from_a_local_model_are_copied_and_frozen(tokenizer, tmp_path):
    from transformers import AutoConfig, AutoModel

    src = AutoModel.from_config(AutoConfig.for_model("bert", vocab_size=len(tokenizer), hidden_size=8,
                                                     num_hidden_layers=1, num_attention_heads=2, intermediate_size=16))
    src.save_pretrained(tmp_path / "src")
    model = bidaf_model(tokenizer, encoder={"embedding_init": str(tmp_path / "src")})
    torch.testing.assert_close(model.encoder.embeddings.weight, src.get_input_embeddings().weight)
    assert not model.encoder.embeddings.weight.requires_grad
    with pytest.raises(ConfigError, match="model.encoder.embedding_size to 8"):
        bidaf_model(tokenizer, encoder={"embedding_init": str(tmp_path / "src"), "embedding_size": 12})


def test_needs_token_types(tokenizer, batch):
    model = bidaf_model(tokenizer)
    with pytest.raises(ConfigError, match="token_type_ids"):
        model.encoder(batch["input_ids"], batch["attention_mask"])


@pytest.mark.parametrize("head, options", [("conditional_pointer", {}), ("matrix", {"direction": "both"})])
def test_bidaf_trains_saves_reloads_and_evaluates_the_same(tmp_path, head, options):
    cfg = build_config(tiny_config(tmp_path, model={"head": head, "head_options": options, "encoder": BIDAF},
                                   train={"max_steps": 3, "eval_every": 3}))
    posbias.train(cfg, progress=False)
    run = tmp_path / "run"
    again = posbias.evaluate(run / "best", DEMO_DEV, tmp_path / "ev", overrides=["data.max_eval_examples=24"],
                             progress=False)
    first = json.loads((run / "eval" / "metrics.json").read_text(encoding="utf-8"))
    assert again["f1"] == pytest.approx(first["f1"])
    read = lambda d: json.loads((d / "nbest.json").read_text(encoding="utf-8"))  # noqa: E731
    nb1, nb2 = read(run / "eval"), read(tmp_path / "ev")
    for qid in nb1:
        np.testing.assert_allclose([c["score"] for c in nb1[qid]], [c["score"] for c in nb2[qid]], rtol=1e-5)
    assert json.loads((run / "best" / "config.json").read_text(encoding="utf-8"))["model_type"] == "bidaf"


def test_position_shifts_refuse_bidaf_which_has_no_positions(tokenizer):
    from posbias.perturb.position_shift import random_padding

    model = bidaf_model(tokenizer)
    with pytest.raises(ConfigError, match=r"^perturb\[0\]: bidaf uses no position ids \(config has no "
                                          r"max_position_embeddings\)"):
        random_padding(max_seq_len=build_config(tiny_config()).data.max_seq_len).bind(model)
