"""`softmax_over` of the `dynamic_query` and `independent` heads (issue 29, item 1): DyReF Eq. 1
normalises over all N input tokens (the authors' dyref.py masks only padding), the default for
`dynamic_query`; `context` is posbias's earlier softmax, which configs saved before the option keep."""
import json
import sqlite3
from contextlib import closing
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

import posbias
from posbias.config import build_config
from posbias.errors import ConfigError
from posbias.qa.collate import collate
from posbias.qa.decode import batch_candidates
from posbias.qa.features import build_qa_features
from posbias.qa.model import build_model
from posbias.registry import HEADS

from helpers import demo_v2_file, tiny_config

RECORDED = Path(__file__).resolve().parents[2] / "docs" / "experiments" / "dyref_fewshot" / "experiment.sqlite"


def qa_model(tokenizer, head, options=None, seed=0, null_answer=False, **model):
    torch.manual_seed(seed)
    cfg = build_config(tiny_config(model={"head": head, "head_options": options or {}, **model}))
    return build_model(cfg.model, tokenizer, null_answer=null_answer).eval()


@pytest.fixture(scope="module")
def feats(tokenizer, dev_examples):
    return build_qa_features(dev_examples[:8], tokenizer, max_seq_len=96, stride=32, max_query_len=24,
                             train=True, version=1)


def batch_of(feats, n=4):
    """n windows, the shortest among them, so that the batch holds padding."""
    idx = np.r_[np.argsort(feats.lengths, kind="stable")[:1], np.arange(n - 1)]
    batch = collate(feats, idx, pad_id=0, with_labels=True)
    return batch, {k: batch.pop(k) for k in ("start_positions", "end_positions")}


@pytest.mark.parametrize("head,options", [("dynamic_query", {}), ("independent", {"softmax_over": "all"})])
def test_all_is_a_softmax_over_every_real_token_by_hand_in_float64(tokenizer, feats, head, options):
    """Eq. 1 by hand: p(start = i) = exp(q_sᵀh_i) / Σ_{i' real} exp(q_sᵀh_i'), [CLS] and question
    tokens included, padding at probability 0; the loss is ½(−log p_s(gold) − log p_e(gold))."""
    model = qa_model(tokenizer, head, options, seed=2).double()
    assert model.head.softmax_over == "all"
    batch, targets = batch_of(feats)
    real = batch["attention_mask"].bool()
    assert (~real).any() and (real & ~batch["span_mask"]).any()  # padding and non-context tokens present
    with torch.no_grad():
        out = model(batch, targets)
        enc = model.encode(batch)
    if head == "dynamic_query":
        tokens, queries = enc["tokens"], enc["queries"]  # (b, s, d), (b, 2, d)
        logits = [(tokens * queries[:, None, q]).sum(-1) for q in (0, 1)]  # q_tᵀh_i
    else:
        w, b = model.head.qa_outputs.weight, model.head.qa_outputs.bias
        logits = [(enc * w[q]).sum(-1) + b[q] for q in (0, 1)]
    loss = 0.0
    for name, z, gold in zip(("start_logits", "end_logits"), logits, targets.values()):
        assert out[name].dtype == torch.float64
        e = torch.exp(z - z[real].max()) * real  # padding contributes nothing
        p = e / e.sum(-1, keepdim=True)  # (b, s)
        got = torch.softmax(out[name], -1)
        torch.testing.assert_close(got, p, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(got[real].new_tensor([got[i][real[i]].sum() for i in range(len(got))]),
                                   torch.ones(len(got), dtype=torch.float64), rtol=0, atol=1e-12)
        assert (got[~real] == 0).all() and (got[real & ~batch["span_mask"]] > 0).all()
        loss = loss - torch.log(p[torch.arange(len(gold)), gold]).mean() / 2
    torch.testing.assert_close(out["loss"], loss, rtol=1e-10, atol=1e-12)


def test_context_keeps_the_earlier_softmax(tokenizer, feats):
    """`context`: the same logits, renormalised over the context tokens only: a smaller loss."""
    batch, targets = batch_of(feats)
    with torch.no_grad():
        a = qa_model(tokenizer, "dynamic_query", seed=4)(batch, targets)
        c = qa_model(tokenizer, "dynamic_query", {"softmax_over": "context"}, seed=4)(batch, targets)
    ok = batch["span_mask"]
    torch.testing.assert_close(a["start_logits"][ok], c["start_logits"][ok])
    assert (c["start_logits"][~ok] == torch.finfo(torch.float32).min).all()
    assert c["loss"] < a["loss"]


def test_defaults_per_head_and_overrides():
    def built(**model):
        cfg = build_config(tiny_config(model=model))
        return cfg.model.softmax_over_default

    assert built(head="dynamic_query") == "all"
    for head in sorted(HEADS.names()):
        if head != "dynamic_query":
            assert built(head=head) == "context", head
    assert built() == "context"  # no head: independent
    assert built(head="independent", softmax_over_default="all") == "all"  # both arms all-token
    with pytest.raises(ConfigError, match="model.softmax_over_default: head 'matrix' has no softmax_over"):
        built(head="matrix", softmax_over_default="all")
    with pytest.raises(ConfigError, match="model.softmax_over_default"):
        built(head="dynamic_query", softmax_over_default="question")
    with pytest.raises(ConfigError, match="model.head_options.softmax_over"):
        built(head="dynamic_query", head_options={"softmax_over": "question"})


def test_the_head_takes_the_default_unless_its_options_say_otherwise(tokenizer):
    assert qa_model(tokenizer, "dynamic_query").head.softmax_over == "all"
    assert qa_model(tokenizer, "independent").head.softmax_over == "context"
    assert qa_model(tokenizer, "independent", softmax_over_default="all").head.softmax_over == "all"
    assert qa_model(tokenizer, "dynamic_query", softmax_over_default="context").head.softmax_over == "context"
    head = qa_model(tokenizer, "dynamic_query", {"softmax_over": "context"}, softmax_over_default="all").head
    assert head.softmax_over == "context"  # the head's own option wins


def test_the_key_leaves_every_other_heads_hash_unchanged():
    """A new config of any head but DyReF hashes as before the key existed (recorded runs of those
    heads stay current); a new DyReF config does not (its runs are re-run with the new softmax)."""
    for head in sorted(HEADS.names()):
        implicit = build_config(tiny_config(model={"head": head}))
        explicit = build_config(tiny_config(model={"head": head, "softmax_over_default": "context"}))
        assert (implicit.hash() == explicit.hash()) == (head != "dynamic_query"), head


def test_recorded_dyref_runs_keep_the_context_softmax_and_their_hashes(tokenizer):
    """The few-shot runs recorded before the option (docs/experiments/dyref_fewshot) rebuild, as saved
    configs, to `context` and their recorded hashes; the same config written today means `all`."""
    with closing(sqlite3.connect(str(RECORDED))) as con:
        rows = [(n, h, json.loads(c)) for n, h, c in con.execute("SELECT name, config_hash, config_json FROM runs")]
    dyref = [(n, h, c) for n, h, c in rows if c["model"]["head"] == "dynamic_query"]
    assert len(dyref) >= 9 and all("softmax_over_default" not in c["model"] for _, _, c in dyref)
    for name, recorded, config in dyref:
        saved = build_config(config, saved=True)
        assert saved.model.softmax_over_default == "context" and saved.hash() == recorded, name
        assert build_config(config).model.softmax_over_default == "all", name


def test_an_old_dyref_checkpoint_loads_with_the_context_softmax(tokenizer, feats, tmp_path):
    """A checkpoint whose posbias.yaml predates the key keeps the context-only softmax it was trained
    with; one saved today keeps `all`."""
    from posbias.checkpoint import load_checkpoint, save_checkpoint

    model = qa_model(tokenizer, "dynamic_query", seed=6)
    cfg = build_config(tiny_config(tmp_path, model={"head": "dynamic_query"}))
    save_checkpoint(model, cfg, tokenizer, tmp_path / "new")
    save_checkpoint(model, cfg, tokenizer, tmp_path / "old")
    path = tmp_path / "old" / "posbias.yaml"
    old = yaml.safe_load(path.read_text(encoding="utf-8"))
    del old["config_version"], old["model"]["softmax_over_default"]  # written before versions and the key
    path.write_text(yaml.safe_dump(old), encoding="utf-8")

    new_model, _, new_cfg = load_checkpoint(tmp_path / "new", task="qa")
    old_model, _, old_cfg = load_checkpoint(tmp_path / "old", task="qa")
    assert new_model.head.softmax_over == "all" and new_cfg.model.softmax_over_default == "all"
    assert old_model.head.softmax_over == "context" and old_cfg.model.softmax_over_default == "context"
    # Its hash is the one computed before the key existed: the key is left out at `context`.
    explicit = build_config({**old, "model": {**old["model"], "softmax_over_default": "context"}})
    assert old_cfg.hash() == explicit.hash() != new_cfg.hash()
    batch, _ = batch_of(feats, 2)
    q = batch["attention_mask"].bool() & ~batch["span_mask"]
    with torch.no_grad():
        assert (old_model.eval()(batch)["start_logits"][q] == torch.finfo(torch.float32).min).all()
        assert (new_model.eval()(batch)["start_logits"][q] > -1e30).all()


@pytest.mark.parametrize("head,options", [("dynamic_query", {}), ("independent", {"softmax_over": "all"})])
def test_decoding_with_all_proposes_context_spans_and_scores_null_at_cls(tokenizer, dev_examples, head, options):
    """Question tokens and [CLS] have real logits under `all`; decoding still proposes only context
    spans, and the v2 null score is the [CLS] span's."""
    model = qa_model(tokenizer, head, options, seed=7, null_answer=True)
    feats = build_qa_features(dev_examples[:8], tokenizer, max_seq_len=96, stride=32, max_query_len=24,
                              train=False, version=2)
    batch = collate(feats, np.arange(4), pad_id=0)
    with torch.no_grad():
        scores = model(batch)
    not_context = batch["attention_mask"].bool() & ~batch["span_mask"]
    assert (scores["start_logits"][not_context] > -1e30).all()  # real logits, not masked
    for name in ("start_logits", "end_logits"):
        scores[name] = scores[name].masked_fill(not_context, 1e4)  # question and [CLS] far ahead
    sc, st, en, null = batch_candidates(model.head, scores, batch, k=10, max_answer_len=30)
    ok = st >= 0
    assert ok.any(axis=1).all() and np.isfinite(sc[ok]).all() and (sc[ok] < 1e4).all()
    rows = np.nonzero(ok)[0]
    span = batch["span_mask"].numpy()
    assert span[rows, st[ok]].all() and span[rows, en[ok]].all() and (en[ok] >= st[ok]).all()
    cls = batch["cls_index"]
    np.testing.assert_allclose(null, (scores["start_logits"][torch.arange(4), cls]
                                      + scores["end_logits"][torch.arange(4), cls]).numpy())
    assert (null == 2e4).all()


def test_squad_v2_with_the_all_token_dyref_trains_and_predicts_context_answers(tmp_path):
    """v2 end to end with DyReF's default softmax: [CLS] labels train, null odds are finite, and
    every non-empty answer is a piece of its context."""
    path, examples = demo_v2_file(tmp_path, 30)
    cfg = build_config(tiny_config(tmp_path, model={"head": "dynamic_query"},
                                   data={"train_file": str(path), "eval_file": str(path),
                                         "max_train_examples": None, "max_eval_examples": None}))
    assert cfg.model.softmax_over_default == "all"
    ev = posbias.train(cfg, progress=False)["eval"]
    assert ev["NoAns_total"] == 10 and ev["HasAns_total"] == 20
    run = tmp_path / "run" / "eval"
    odds = json.loads((run / "null_odds.json").read_text(encoding="utf-8"))
    assert len(odds) == 30 and all(np.isfinite(v) for v in odds.values())
    preds = json.loads((run / "predictions.json").read_text(encoding="utf-8"))
    contexts = {e.id: e.context for e in examples}
    assert all(p == "" or p in contexts[qid] for qid, p in preds.items())
