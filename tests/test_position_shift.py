"""Random Padding as shifted position ids: equal to literally moving padding, and always in range."""
import random
import warnings

import numpy as np
import pytest
import torch

from posbias.config import build_config
from posbias.qa.collate import collate
from posbias.qa.examples import Answer, QAExample
from posbias.qa.features import build_qa_features
from posbias.errors import ConfigError
from posbias.qa.heads.independent import IndependentHead
from posbias.qa.labels import occurrences, random_occurrence
from posbias.qa.model import QAModel
from posbias.perturb import build_perturbations
from posbias.perturb.position_shift import sample_random_padding, shift_position_ids

from conftest import relative_error, tiny_config


def tiny_encoder(model_type="bert", **kw):
    from transformers import AutoConfig, AutoModel

    torch.manual_seed(0)
    cfg = AutoConfig.for_model(model_type, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                               intermediate_size=64, vocab_size=120, hidden_dropout_prob=0.0,
                               attention_probs_dropout_prob=0.0, **kw)
    return AutoModel.from_config(cfg, add_pooling_layer=False).eval()


ENCODERS = [("bert", {"max_position_embeddings": 64}),
            ("roberta", {"max_position_embeddings": 66, "pad_token_id": 1})]


def literal_vs_shifted(model_type, extra, k, shift=shift_position_ids):
    """Relative differences (logits, worst parameter gradient) between literal Random Padding —
    [CLS] {k PAD} rest {n-m-k PAD} with positions by slot — and the unpadded input whose position ids
    `shift` moves by k. Run in float64: the claim is exact equality, so double precision makes the
    comparison sharp on any CPU (float32 kernels round differently on Intel and AMD)."""
    enc = tiny_encoder(model_type, **extra).double()
    model = QAModel(enc, IndependentHead(32), "independent", False)
    head_w = torch.randn(32, 2, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    pad, n, m = enc.config.pad_token_id, 40, 12
    ids = torch.randint(5, 120, (1, m), generator=torch.Generator().manual_seed(2))
    ids[0, 0] = 3  # [CLS]-like first token

    def run(input_ids, attention_mask, position_ids):
        enc.zero_grad()
        h = enc(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids).last_hidden_state
        real = attention_mask[0].bool()
        logits = h[0, real] @ head_w  # the real tokens' start/end logits, in order
        logits.pow(2).sum().backward()
        return logits.detach(), {n_: p.grad.clone() for n_, p in enc.named_parameters() if p.grad is not None}

    # literal Random Padding: k pads after [CLS], the rest at the end
    lit_ids = torch.cat([ids[:, :1], torch.full((1, k), pad), ids[:, 1:], torch.full((1, n - m - k), pad)], 1)
    lit_mask = (torch.arange(n) < 1) | ((torch.arange(n) > k) & (torch.arange(n) < m + k))
    lit_mask = lit_mask.long()[None]
    # Positions by slot, as the paper intends. (HF RoBERTa's own default numbers positions by the
    # cumulative count of non-pad tokens, which would silently undo literal padding moves.)
    lit_pos = model.position_base + torch.arange(n)[None]
    lit_pos = lit_pos.masked_fill(lit_mask == 0, model.position_pad)
    lit_logits, lit_grads = run(lit_ids, lit_mask, lit_pos)
    # posbias: no padding at all, ids after [CLS] shifted by k
    mask = torch.ones(1, m, dtype=torch.long)
    pos = shift(mask, torch.tensor([0]), torch.tensor([k]), base=model.position_base,
                pad_position=model.position_pad)
    logits, grads = run(ids, mask, pos)
    assert set(grads) <= set(lit_grads)
    # Gradients are measured against the largest gradient of the model: some are mathematically zero
    # (attention key biases: softmax ignores a constant shift), so their own scale is rounding noise.
    scale = max(g.abs().max().item() for g in lit_grads.values())
    grad_err = max((g - lit_grads[name]).abs().max().item() for name, g in grads.items()) / scale
    return relative_error(logits, lit_logits), grad_err


@pytest.mark.parametrize("model_type, extra", ENCODERS)
@pytest.mark.parametrize("k", [0, 1, 7, 23])
def test_shift_equals_literally_moving_padding(model_type, extra, k):
    """Same logits and same encoder gradients (tiny BERT and RoBERTa, several k), to 1e-10 of their
    scale in float64 (float32 rounding alone would be ~1e-7)."""
    mask = torch.ones(1, 12, dtype=torch.long)
    base = 2 if model_type == "roberta" else 0
    pos = shift_position_ids(mask, torch.tensor([0]), torch.tensor([k]), base=base)
    assert pos[0, :3].tolist() == [base, base + 1 + k, base + 2 + k]
    logit_err, grad_err = literal_vs_shifted(model_type, extra, k)
    assert logit_err < 1e-10 and grad_err < 1e-10, (logit_err, grad_err)


def _off_by_one(mask, cls_index, shift, **kw):
    return shift_position_ids(mask, cls_index, shift + 1, **kw)


def _cls_moved_too(mask, cls_index, shift, **kw):
    pos = shift_position_ids(mask, cls_index, shift, **kw)
    pos[:, 0] += shift
    return pos


@pytest.mark.parametrize("model_type, extra", ENCODERS)
@pytest.mark.parametrize("wrong", [_off_by_one, _cls_moved_too])
def test_a_wrong_shift_fails_the_equivalence(model_type, extra, wrong):
    """The comparison above can fail: an off-by-one shift, or moving [CLS] as well, is caught by
    orders of magnitude."""
    logit_err, grad_err = literal_vs_shifted(model_type, extra, 7, shift=wrong)
    assert logit_err > 1e-4 and grad_err > 1e-4, (logit_err, grad_err)


def test_positions_never_leave_the_table():
    """Property: over random lengths, caps and draws, max position id < max_position_embeddings."""
    g = torch.Generator().manual_seed(0)
    rng = np.random.default_rng(0)
    for base, n_pos, n in [(0, 512, 512), (2, 514, 512), (0, 512, 384), (0, 128, 100)]:
        for _ in range(200):
            b = int(rng.integers(1, 6))
            lengths = torch.from_numpy(rng.integers(2, n + 1, size=b))
            s = int(lengths.max())
            mask = (torch.arange(s)[None] < lengths[:, None]).long()
            cap = None if rng.random() < 0.5 else int(rng.integers(0, 300))
            k = sample_random_padding(lengths, n, cap, g)
            assert ((k >= 0) & (k <= (n - lengths)) & (k <= (cap if cap is not None else n))).all()
            pos = shift_position_ids(mask, torch.zeros(b, dtype=torch.long), k, base=base)
            assert int(pos.max()) < n_pos and int(pos[mask.bool()].min()) == base


def test_sampler_is_uniform_over_its_range():
    g = torch.Generator().manual_seed(0)
    k = sample_random_padding(torch.full((40000,), 500), 512, None, g)  # U{0..12}
    counts = np.bincount(k.numpy(), minlength=13)
    assert len(counts) == 13 and counts.min() > 0.9 * 40000 / 13 and counts.max() < 1.1 * 40000 / 13
    capped = sample_random_padding(torch.full((1000,), 100), 512, 5, g)
    assert int(capped.max()) == 5


def test_perturbation_leaves_input_and_cls_alone(tokenizer, dev_examples):
    cfg = build_config(tiny_config() | {"perturb": [{"name": "random_padding"}]})
    (p,) = build_perturbations(cfg.perturb, cfg)
    feats = build_qa_features(dev_examples[:8], tokenizer, max_seq_len=128, doc_stride=48, train=True)
    batch = collate(feats, np.arange(8), pad_id=0, with_labels=True)
    before = {k: v.clone() for k, v in batch.items()}
    out = p(batch, torch.Generator().manual_seed(3))
    assert all(torch.equal(before[k], batch[k]) for k in before) and "position_ids" not in batch
    pos = out["position_ids"]
    assert (pos[:, 0] == 0).all()  # [CLS] stays at position 0
    m = batch["attention_mask"].sum(1)
    assert ((out["position_shift"] >= 0) & (out["position_shift"] <= 128 - m)).all()
    assert (out["position_shift"] > 0).any()


def test_too_long_max_len_is_refused_naming_the_keys(tokenizer):
    from conftest import tiny_model

    cfg = build_config(tiny_config() | {"perturb": [{"name": "random_padding", "max_len": 600}]})
    (p,) = build_perturbations(cfg.perturb, cfg)
    with pytest.raises(ConfigError, match=r"perturb\[0\]\.max_len \(600\).*max_position_embeddings \(512\)"):
        p.bind(tiny_model(tokenizer))
    with pytest.raises(ConfigError, match="cap must be a non-negative integer"):
        build_config(tiny_config() | {"perturb": [{"name": "random_padding", "cap": -1}]})


def test_relative_position_models_get_a_warning():
    enc = tiny_encoder("bert", position_embedding_type="relative_key", max_position_embeddings=64)
    model = QAModel(enc, IndependentHead(32), "independent", False)
    cfg = build_config(tiny_config() | {"perturb": [{"name": "random_padding", "max_len": 64}]})
    (p,) = build_perturbations(cfg.perturb, cfg)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        p.bind(model)
    assert any("no effect" in str(x.message) for x in w)


def test_training_with_random_padding_runs(tmp_path):
    import json

    import posbias

    cfg = build_config(tiny_config(tmp_path, data={"eval_file": None}) | {"perturb": [{"name": "random_padding"}]})
    assert posbias.train(cfg, progress=False)["steps"] == 3
    base = build_config(tiny_config(tmp_path / "b", data={"eval_file": None}))
    posbias.train(base, progress=False)
    order = lambda p: json.loads((p / "data_order" / "epoch-0.json").read_text(encoding="utf-8"))["batches"]  # noqa: E731
    assert order(tmp_path / "run") == order(tmp_path / "b" / "run")  # same batches as the baseline


def test_random_occurrence_label_policy():
    ctx = "Paris. Later Paris again, and Paris."
    ex = QAExample("q", "Where?", ctx, answers=[Answer("Paris", 0)])
    assert occurrences("Paris", ctx) == [0, 13, 30]
    assert occurrences("aa", "aaa") == [0, 1]
    picks = {random_occurrence(ex, random.Random(s)).start for s in range(50)}
    assert picks == {0, 13, 30}
    assert all(ctx[a.start:a.end] == "Paris" for a in [random_occurrence(ex, random.Random(1))])
    single = QAExample("s", "Q?", "only once here", answers=[Answer("once", 5)])
    assert random_occurrence(single, random.Random(0)) is single.answers[0]


def test_rows_without_cls_shift_every_token():
    """Decoder tokenizers (GPT-2) add no [CLS]: cls_index -1 moves every real token."""
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])
    pos = shift_position_ids(mask, torch.tensor([-1, 0]), torch.tensor([5, 2]))
    assert pos.tolist() == [[5, 6, 7, 0], [0, 3, 4, 5]]


def test_random_padding_composes_with_tagging(tmp_path):
    """The same perturbation on the tagging task: [CLS] stays at 0, the other tokens move, and the
    shift never leaves the position table."""
    import posbias
    from posbias.config import config_from

    cfg = config_from("tiny_tagging", [f"train.output_dir={tmp_path / 'run'}", "train.max_steps=3",
                                       "data.eval_file=null", "perturb=[{name: random_padding}]"])
    posbias.train(cfg, progress=False)
    import json

    updates = json.loads((tmp_path / "run" / "position_updates.json").read_text(encoding="utf-8"))
    assert updates["counts"][0] == 3 and sum(updates["counts"][128:]) == 0
    assert sum(updates["counts"][64:128]) > 0  # shifted positions reach the rear of the window
