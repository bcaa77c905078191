"""Encoder + head: context-only softmax, padding-side invariance, RoBERTa positions, checkpoints."""
import numpy as np
import pytest
import torch
from torch.nn import functional as F

from posbias.qa.collate import collate
from posbias.qa.features import build_qa_features
from posbias.checkpoint import load_checkpoint, save_checkpoint
from posbias.qa.model import QAModel
from posbias.registry import HEADS

from helpers import relative_error, tiny_model


@pytest.fixture(scope="module")
def feats(tokenizer, dev_examples):
    return build_qa_features(dev_examples[:12], tokenizer, max_seq_len=96, stride=32, max_query_len=24,
                             train=True, version=1)


def test_loss_is_softmax_over_context_tokens_only(tokenizer, feats):
    model = tiny_model(tokenizer).eval()
    batch = collate(feats, np.arange(6), pad_id=0, with_labels=True)
    targets = {k: batch[k] for k in ("start_positions", "end_positions")}
    out = model(batch, targets)
    ctx = batch["span_mask"]
    # Question, special and padding tokens are masked out of the softmax (Eq. 1-2) ...
    assert (out["start_logits"][~ctx] == torch.finfo(torch.float32).min).all()
    # ... and the loss equals a cross-entropy computed over context logits alone.
    logits = model.head.qa_outputs(model.encode(batch))
    manual = []
    for r in range(6):
        c = torch.nonzero(ctx[r]).flatten()
        for k, t in ((0, batch["start_positions"][r]), (1, batch["end_positions"][r])):
            lp = F.log_softmax(logits[r, c, k], dim=0)
            manual.append(-lp[(c == t).nonzero()[0, 0]])
    assert out["loss"].item() == pytest.approx(torch.stack(manual).mean().item(), rel=1e-5)


def test_v2_head_adds_cls_as_candidate(tokenizer, feats):
    model = tiny_model(tokenizer, null_answer=True).eval()
    batch = collate(feats, np.arange(4), pad_id=0)
    out = model(batch)
    rows = torch.arange(4)
    assert (out["start_logits"][rows, batch["cls_index"]] > -1e30).all()
    assert model.head.null_scores(out, batch["cls_index"]).shape == (4,)


def _left_vs_right_error(tokenizer, feats, left_positions=None) -> float:
    """Largest relative difference of the real tokens' start logits, left- vs right-padded, in float64
    (the claim is equality, so double precision makes it sharp on any CPU)."""
    model = tiny_model(tokenizer).eval().double()
    idx = np.array([0, 6, 12, 13])  # windows of 96, 62, 65 and 69 tokens
    right = collate(feats, idx, pad_id=0, padding_side="right")
    left = collate(feats, idx, pad_id=0, padding_side="left")
    assert sorted(left["pad_left"].tolist()) == [0, 27, 31, 34]  # padding does happen
    if left_positions is not None:
        left["position_ids"] = left_positions(left["attention_mask"])
    with torch.no_grad():
        r, l = model(right)["start_logits"], model(left)["start_logits"]
    errs = []
    for row, w in enumerate(idx):
        n = len(feats.input_ids[w])
        p = int(left["pad_left"][row])
        ctx = right["span_mask"][row, :n]  # context tokens: the rest sit at the dtype's minimum
        errs.append(relative_error(l[row, p:p + n][ctx], r[row, :n][ctx]))
    return max(errs)


def test_left_and_right_padding_give_the_same_scores(tokenizer, feats):
    assert _left_vs_right_error(tokenizer, feats) < 1e-10
    # The comparison can fail: numbering positions by slot (counting the left padding, as a model's
    # default position ids would) moves every token and changes the scores.
    by_slot = lambda mask: torch.arange(mask.shape[1]).expand_as(mask)  # noqa: E731
    assert _left_vs_right_error(tokenizer, feats, by_slot) > 1e-3


def test_roberta_positions_start_after_padding_idx(tokenizer):
    from transformers import AutoConfig, AutoModel

    torch.manual_seed(0)
    cfg = AutoConfig.for_model("roberta", hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                               intermediate_size=64, vocab_size=200, pad_token_id=1, max_position_embeddings=80)
    enc = AutoModel.from_config(cfg, add_pooling_layer=False).eval()
    model = QAModel(enc, HEADS.get("independent")(32), "independent", False)
    assert (model.position_base, model.position_pad) == (2, 1)
    ids = torch.tensor([[0, 5, 6, 7, 2], [0, 8, 2, 1, 1]])
    attn = (ids != 1).long()
    pos = model.position_ids(attn)
    assert pos.tolist() == [[2, 3, 4, 5, 6], [2, 3, 4, 1, 1]]
    with torch.no_grad():  # equals RoBERTa's own numbering for right padding
        ours = enc(input_ids=ids, attention_mask=attn, position_ids=pos).last_hidden_state
        theirs = enc(input_ids=ids, attention_mask=attn).last_hidden_state
    torch.testing.assert_close(ours, theirs)


def test_checkpoint_roundtrip(tokenizer, feats, tmp_path, tiny_cfg):
    model = tiny_model(tokenizer, seed=3).eval()
    save_checkpoint(model, tiny_cfg, tokenizer, tmp_path / "ck")
    loaded, tok, cfg = load_checkpoint(tmp_path / "ck")
    batch = collate(feats, np.arange(5), pad_id=0)
    with torch.no_grad():
        torch.testing.assert_close(model(batch)["end_logits"], loaded.eval()(batch)["end_logits"])
    assert cfg == tiny_cfg and len(tok) == len(tokenizer)
    assert (tmp_path / "ck" / "model.safetensors").is_file()


def test_all_token_softmax_option_changes_the_loss_not_the_candidates(tokenizer, feats):
    """softmax_over=all (HF's loss) normalises over question tokens too: a larger loss on the same
    logits; decoding still only proposes context spans."""
    ctx_head = tiny_model(tokenizer, seed=5).eval()
    all_head = tiny_model(tokenizer, seed=5).eval()
    all_head.head.softmax_over = "all"
    batch = collate(feats, np.arange(6), pad_id=0, with_labels=True)
    targets = {k: batch[k] for k in ("start_positions", "end_positions")}
    with torch.no_grad():
        a, b = ctx_head(batch, targets), all_head(batch, targets)
    assert b["loss"] > a["loss"]
    q = batch["attention_mask"].bool() & ~batch["span_mask"]
    assert (b["start_logits"][q] > -1e30).all() and (a["start_logits"][q] < -1e30).all()


def test_pretrained_encoder_loads_quietly_and_names_missing_weights(tokenizer, tmp_path, capfd):
    """A local encoder folder loads without transformers' load-report table (the dropped pooler is
    expected); weights the folder lacks are named in one warning, not silently left random."""
    from safetensors.torch import load_file, save_file
    from transformers import AutoConfig, AutoModel

    from posbias.config import ModelConfig
    from posbias.qa.model import build_model

    from helpers import TINY_ENCODER

    spec = {k: v for k, v in TINY_ENCODER.items() if k != "model_type"}
    cfg = AutoConfig.for_model("bert", vocab_size=len(tokenizer), **spec)
    AutoModel.from_config(cfg).save_pretrained(str(tmp_path / "enc"))  # with a pooler
    capfd.readouterr()
    mcfg = ModelConfig(name_or_path=str(tmp_path / "enc"), tokenizer="tiny")
    build_model(mcfg, tokenizer, null_answer=False)
    out, err = capfd.readouterr()
    assert "LOAD REPORT" not in out + err and "Loading weights" not in out + err

    weights = tmp_path / "enc" / "model.safetensors"
    state = load_file(str(weights))
    del state["encoder.layer.1.output.dense.weight"]
    save_file(state, str(weights), metadata={"format": "pt"})
    with pytest.warns(UserWarning, match=r"1 weight\(s\) .*encoder\.layer\.1\.output\.dense\.weight"):
        build_model(mcfg, tokenizer, null_answer=False)
