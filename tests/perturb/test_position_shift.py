"""Position shifts: Random Padding equals literally moving padding; Random Position Perturbation keeps
every position in the table and samples the paper's interval; the replace / augment modes."""
import random

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
from posbias.perturb import build_perturbations, training_passes
from posbias.perturb.position_shift import (PositionShift, sample_random_padding, sample_rpp, sample_rpp_start,
                                            shift_position_ids)
from posbias.tagging.model import TaggerModel

from helpers import relative_error, tiny_config


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
    feats = build_qa_features(dev_examples[:8], tokenizer, max_seq_len=128, stride=48, train=True)
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
    from helpers import tiny_model

    cfg = build_config(tiny_config() | {"perturb": [{"name": "random_padding", "max_len": 600}]})
    (p,) = build_perturbations(cfg.perturb, cfg)
    with pytest.raises(ConfigError, match=r"perturb\[0\]\.max_len \(600\).*max_position_embeddings \(512\)"):
        p.bind(tiny_model(tokenizer))
    with pytest.raises(ConfigError, match="cap must be a non-negative integer"):
        build_config(tiny_config() | {"perturb": [{"name": "random_padding", "cap": -1}]})


def test_relative_position_models_are_refused():
    """Relative attention counts distances by slot: shifted ids move no word (config-read, see
    tests/core/test_position_kind.py for every architecture)."""
    enc = tiny_encoder("bert", position_embedding_type="relative_key", max_position_embeddings=64)
    model = QAModel(enc, IndependentHead(32), "independent", False)
    cfg = build_config(tiny_config() | {"perturb": [{"name": "random_padding", "max_len": 64}]})
    (p,) = build_perturbations(cfg.perturb, cfg)
    with pytest.raises(ConfigError, match=r"^perturb\[0\]: bert uses relative positions \(config "
                                          r"position_embedding_type='relative_key'\)"):
        p.bind(model)


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


# ---- Random Position Perturbation (token classification paper, §4.1)



def tiny_tagger(model_type="bert", dtype=torch.float32, **kw):
    return TaggerModel(tiny_encoder(model_type, **kw), ["O", "B-x", "I-x"], "iob2", dropout=0.0).to(dtype).eval()


TAGGERS = [("bert", {"max_position_embeddings": 64}, 0),  # base 0, pad id 0
           ("roberta", {"max_position_embeddings": 66, "pad_token_id": 1}, 1)]  # base 2, pad id 1


def random_rows(rng, max_len: int, pad_id: int, side: str) -> dict:
    """A batch of 1-6 rows of 2..max_len real tokens (some past max_len / 2, where the paper's
    interval is empty, one often at the limit), padded on `side` with `pad_id`; some rows without
    a leading special token."""
    b = int(rng.integers(1, 7))
    lengths = rng.integers(2, max_len + 1, size=b)
    if rng.random() < 0.3:
        lengths[int(rng.integers(0, b))] = max_len
    s = int(lengths.max())
    ids = torch.full((b, s), pad_id)
    mask = torch.zeros(b, s, dtype=torch.long)
    pad_left = torch.from_numpy(s - lengths) if side == "left" else torch.zeros(b, dtype=torch.long)
    for r, n in enumerate(lengths):
        ids[r, pad_left[r]: pad_left[r] + n] = torch.from_numpy(rng.integers(5, 120, size=n))
        mask[r, pad_left[r]: pad_left[r] + n] = 1
    with_cls = torch.from_numpy(rng.random(b) < 0.8)
    return {"input_ids": ids, "attention_mask": mask, "cls_index": torch.where(with_cls, pad_left, -1),
            "pad_left": pad_left}


def rpp_violations(batch: dict, out: dict, *, base: int, pad_position: int, n_pos: int, max_len: int) -> list[str]:
    """Every RPP invariant a row breaks, as messages; also returns nothing for a correct output."""
    errors = []
    mask = batch["attention_mask"].bool()
    pos = out["position_ids"]
    for r in range(len(mask)):
        real = pos[r][mask[r]]  # real tokens' position ids, in order
        n = len(real)
        if (pos[r][~mask[r]] != pad_position).any():
            errors.append(f"row {r}: padding not at the pad position {pad_position}")
        if int(real.max()) >= n_pos:
            errors.append(f"row {r}: position {int(real.max())} overflows the table ({n_pos})")
        f = int(batch["cls_index"][r] >= 0)
        if f and int(pos[r, batch["cls_index"][r]]) != base:
            errors.append(f"row {r}: [CLS] moved to {int(pos[r, batch['cls_index'][r]])}")
        moved = real[f:]
        if len(moved) > 1 and not (moved.diff() == 1).all():
            errors.append(f"row {r}: real tokens no longer consecutive")
        p_r = int(moved[0]) - base
        lo, hi = (n, max_len - n) if n <= max_len - n else (f, max_len - n + f)  # I, else every fitting start
        if not lo <= p_r <= hi:
            errors.append(f"row {r}: p_r {p_r} outside [{lo}, {hi}]")
    return errors


def rpp_run(p, model_type, extra, pad_id, draws=300, seed=0):
    """Apply perturbation `p` to `draws` random batches (left and right padding); all violations and
    the (l, p_r) pairs of the rows with a [CLS]."""
    rng = np.random.default_rng(seed)
    g = torch.Generator().manual_seed(seed)
    n_pos = extra["max_position_embeddings"]
    errors, starts = [], []
    for i in range(draws):
        batch = random_rows(rng, p.max_len, pad_id, "left" if i % 2 else "right")
        before = {k: v.clone() for k, v in batch.items()}
        out = p(batch, g)
        assert all(torch.equal(before[k], batch[k]) for k in before) and "position_ids" not in batch
        errors += rpp_violations(batch, out, base=p.base, pad_position=p.pad_position, n_pos=n_pos, max_len=p.max_len)
        has_cls = batch["cls_index"] >= 0
        lengths = batch["attention_mask"].sum(1)
        starts += list(zip(lengths[has_cls].tolist(), (out["position_shift"][has_cls] + 1).tolist()))
    return errors, starts


def build_rpp(spec: dict, model):
    cfg = build_config(tiny_config() | {"perturb": [spec]})
    (p,) = build_perturbations(cfg.perturb, cfg)
    p.bind(model)
    return p


@pytest.mark.parametrize("model_type, extra, pad_id", TAGGERS)
def test_rpp_never_overflows_and_keeps_cls(model_type, extra, pad_id):
    """Property over random rows (lengths up to the table, left and right padding, rows with and
    without [CLS]): positions stay in the table, [CLS] keeps its base position, real tokens stay
    consecutive, padding gets the pad position, p_r lies in the paper's interval when it is
    non-empty (else in the fitting starts), and the draws reach both ends of the interval."""
    model = tiny_tagger(model_type, **extra)
    p = build_rpp({"name": "random_position_perturbation"}, model)
    assert p.base == model.position_base == (2 if model_type == "roberta" else 0)
    assert p.max_len == 64  # default: the usable table, max_position_embeddings - base
    errors, _ = rpp_run(p, model_type, extra, pad_id)
    assert errors == []
    # Many rows of a few lengths: p_r covers the paper's interval [l, 64 - l] end to end, and for
    # l = 50 (interval empty) every fitting start 1 .. 64 - 50 + 1.
    g = torch.Generator().manual_seed(1)
    for side in ("right", "left"):
        lengths = torch.tensor([5, 20, 32, 50] * 800)
        s = int(lengths.max())
        slots = torch.arange(s)[None]
        pad_left = s - lengths if side == "left" else torch.zeros_like(lengths)
        mask = ((slots >= pad_left[:, None]) & (slots < (pad_left + lengths)[:, None])).long()
        batch = {"input_ids": torch.where(mask.bool(), 7, pad_id), "attention_mask": mask, "cls_index": pad_left}
        out = p(batch, g)
        assert rpp_violations(batch, out, base=p.base, pad_position=p.pad_position,
                              n_pos=extra["max_position_embeddings"], max_len=64) == []
        p_r = out["position_shift"] + 1
        for n, lo, hi in [(5, 5, 59), (20, 20, 44), (32, 32, 32), (50, 1, 15)]:
            got = p_r[lengths == n]
            assert (int(got.min()), int(got.max())) == (lo, hi), (side, n, int(got.min()), int(got.max()))


def test_rpp_sampler_is_uniform_over_the_papers_interval():
    g = torch.Generator().manual_seed(0)
    n = 11000
    p_r = sample_rpp_start(torch.full((n,), 10), torch.ones(n, dtype=torch.bool), 30, g)  # I = {10 .. 20}
    counts = np.bincount(p_r.numpy())
    assert int(p_r.min()) == 10 and int(p_r.max()) == 20
    assert counts[10:].min() > 0.85 * n / 11 and counts[10:].max() < 1.15 * n / 11
    # Empty interval (l = 20 > 30 - 20): every start that fits, {1 .. 11} after [CLS], {0 .. 10} without.
    long_row = sample_rpp_start(torch.full((2000,), 20), torch.ones(2000, dtype=torch.bool), 30, g)
    assert set(long_row.tolist()) == set(range(1, 12))
    no_cls = sample_rpp_start(torch.full((2000,), 20), torch.zeros(2000, dtype=torch.bool), 30, g)
    assert set(no_cls.tolist()) == set(range(0, 11))
    # tau = p_r - 1 after [CLS] (Fig. 8: p_r = 7 moves word_1 from 1 to 7), p_r itself without one.
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    has = torch.tensor([True, False])
    assert (sample_rpp(torch.tensor([6, 6]), has, 64, g1) == sample_rpp_start(torch.tensor([6, 6]), has, 64, g2)
            - has.long()).all()
    mask = torch.ones(1, 7, dtype=torch.long)
    assert shift_position_ids(mask, torch.tensor([0]), torch.tensor([6])).tolist() == [[0, 7, 8, 9, 10, 11, 12]]


def _paper_top_plus_one(lengths, has_cls, max_len, gen):
    """Wrong: p_r up to M - l + 1 in the paper's interval (one past I's top)."""
    f = has_cls.long()
    lo = torch.where(lengths <= max_len - lengths, lengths, f)
    hi = torch.where(lengths <= max_len - lengths, max_len - lengths + 1, max_len - lengths + f)
    u = torch.rand(lengths.shape, generator=gen)
    return lo + torch.minimum((u * (hi - lo + 1).double()).long(), hi - lo) - f


def _fit_plus_one(lengths, has_cls, max_len, gen):
    """Wrong: the long-row fallback one start too far (p_r up to M - l + 2 after [CLS])."""
    return sample_rpp(lengths, has_cls, max_len + 1, gen)


def _table_without_base(lengths, has_cls, max_len, gen):
    """Wrong: M taken as max_position_embeddings, forgetting RoBERTa's first position id (2)."""
    return sample_rpp(lengths, has_cls, max_len + 2, gen)


@pytest.mark.parametrize("wrong, model_type, caught_by", [
    (_paper_top_plus_one, "bert", "outside"), (_fit_plus_one, "bert", "overflows"),
    (_table_without_base, "roberta", "overflows")])
def test_a_wrong_rpp_sampler_fails_the_checks(wrong, model_type, caught_by):
    """The checks above can fail. p_r = M - l + 1 still fits the table (the last token lands on
    M - 1), so that off-by-one is caught by the interval check; one start further (or M counted
    without RoBERTa's base) overflows the table on rows at the limit."""
    _, extra, pad_id = next(t for t in TAGGERS if t[0] == model_type)
    model = tiny_tagger(model_type, **extra)
    p = PositionShift(wrong, None, "perturb[0]", fallback_len=64)
    p.bind(model)
    errors, _ = rpp_run(p, model_type, extra, pad_id, draws=200)
    assert any(caught_by in e for e in errors), errors[:3]


def test_rpp_options_alias_and_table_check():
    model = tiny_tagger("bert", max_position_embeddings=64)
    assert build_rpp({"name": "rpp"}, model).max_len == 64
    assert build_rpp({"name": "rpp", "max_len": 40, "mode": "augment"}, model).max_len == 40
    cfg = build_config(tiny_config() | {"perturb": [{"name": "rpp", "max_len": 65}]})
    (p,) = build_perturbations(cfg.perturb, cfg)
    with pytest.raises(ConfigError, match=r"perturb\[0\]\.max_len \(65\).*max_position_embeddings \(64\)"):
        p.bind(model)
    with pytest.raises(ConfigError, match=r"perturb\[0\]: unknown option 'cap'"):
        build_config(tiny_config() | {"perturb": [{"name": "random_position_perturbation", "cap": 3}]})
    for bad in ("both", None, "Replace"):
        with pytest.raises(ConfigError, match=r"perturb\[1\]\.mode must be one of \['replace', 'augment'\]"):
            build_perturbations([{"name": "rpp"}, {"name": "random_padding", "mode": bad}], cfg)
        with pytest.raises(ConfigError, match=r"perturb\[0\]\.mode"):
            build_config(tiny_config() | {"perturb": [{"name": "random_padding", "mode": bad}]})


def test_rpp_without_table_falls_back_to_max_seq_len():
    """Encoders without a position table (BLOOM: ALiBi) have no usable table: M = data.max_seq_len."""
    class NoTable:
        model_type, position_embedding_type = "bloom", "absolute"

    class Model:
        encoder = type("E", (), {"config": NoTable()})()
        position_base, position_pad = 0, 0

    cfg = build_config(tiny_config(data={"max_seq_len": 160}) | {"perturb": [{"name": "rpp"}]})
    (p,) = build_perturbations(cfg.perturb, cfg)
    p.bind(Model())
    assert p.max_len == 160


class Trail:
    """A recording perturbation: appends its name to batch["trail"] (a new list: input untouched)."""

    def __init__(self, name):
        self.name = name

    def __call__(self, batch, gen):
        return {**batch, "trail": batch.get("trail", []) + [self.name]}


def test_training_passes_follow_the_modes():
    batch = {"x": 1}
    passes = training_passes(batch, [Trail("r1"), Trail("r2")], [Trail("a1"), Trail("a2")], None)
    assert [p.get("trail") for p in passes] == [["r1", "r2"], ["r1", "r2", "a1"], ["r1", "r2", "a2"]]
    assert batch == {"x": 1}
    assert [p.get("trail") for p in training_passes(batch, [], [], None)] == [None]


def test_augment_loss_is_clean_plus_perturbed_with_one_backward():
    """`passes_loss` over [batch, rpp(batch)] is L(batch) + L(rpp(batch)), and one backward of the sum
    gives the sum of the two separate gradients (float64: the claim is exact up to rounding)."""
    from posbias.training import passes_loss

    model = tiny_tagger("bert", dtype=torch.float64, max_position_embeddings=64)
    p = build_rpp({"name": "rpp", "mode": "augment"}, model)
    rng = np.random.default_rng(1)
    batch = random_rows(rng, 30, 0, "right")
    batch["labels"] = torch.from_numpy(rng.integers(0, 3, size=batch["input_ids"].shape)).masked_fill(
        batch["attention_mask"] == 0, -100)
    targets = lambda b: {"labels": b["labels"]}  # noqa: E731
    passes = training_passes(batch, [], [p], torch.Generator().manual_seed(7))
    assert len(passes) == 2 and "position_ids" not in passes[0] and "position_ids" in passes[1]

    def grads():
        g = {n: q.grad.clone() for n, q in model.named_parameters() if q.grad is not None}
        model.zero_grad()
        return g

    model.zero_grad()
    total = passes_loss(model, passes, targets)
    total.backward()
    g_sum = grads()
    clean = model(batch, targets(batch))["loss"]
    clean.backward()
    g_clean = grads()
    shifted = model(p(batch, torch.Generator().manual_seed(7)), targets(batch))["loss"]
    shifted.backward()
    g_shift = grads()
    assert relative_error(total.detach(), (clean + shifted).detach()) < 1e-12
    assert abs(shifted.item() - clean.item()) > 1e-6  # the perturbed pass is a different pass
    scale = max(g.abs().max().item() for g in g_sum.values())
    err = max((g_sum[n] - g_clean[n] - g_shift[n]).abs().max().item() for n in g_sum) / scale
    assert err < 1e-10, err


def _tagging_run(tmp_path, name, *extra):
    import json

    import posbias
    from posbias.config import config_from

    out = tmp_path / name
    cfg = config_from("tiny_tagging", [f"train.output_dir={out}", "train.max_steps=2", "train.log_every=1",
                                       "data.eval_file=null", *extra])
    posbias.train(cfg, progress=False)
    updates = json.loads((out / "position_updates.json").read_text(encoding="utf-8"))
    log = [json.loads(x) for x in (out / "train_log.jsonl").read_text(encoding="utf-8").splitlines()]
    return cfg, updates["counts"], log


def test_rpp_trains_in_replace_and_augment_mode(tmp_path):
    """tiny_tagging, 2 steps. replace: no token after [CLS] keeps position 1 (p_r >= l >= 3) and the
    shifts reach past data.max_seq_len (128: M is the whole table, 512). augment, RPP's default
    (an entry without `mode`): the clean pass is trained too (position 1 in both steps), and the
    first step's logged loss is the clean loss plus the perturbed loss, recomputed here from the
    same weights, batch and generator."""
    from posbias.batching import batch_order
    from posbias.tasks import get_task
    from posbias.training import batch_generator
    from posbias.utils import set_seed

    _, counts, _ = _tagging_run(tmp_path, "replace", "perturb=[{name: rpp, mode: replace}]")
    assert counts[0] == 2 and counts[1] == 0 and sum(counts[128:]) > 0
    no_dropout = ["model.encoder.hidden_dropout_prob=0.0", "model.encoder.attention_probs_dropout_prob=0.0"]
    cfg, counts, log = _tagging_run(tmp_path, "augment", "perturb=[{name: rpp}]", *no_dropout)
    assert counts[0] == 2 and counts[1] == 2 and sum(counts[128:]) > 0

    t = cfg.train
    task = get_task("tagging")
    tok = task.load_tokenizer(cfg)
    ds = task.read(cfg.data.train_file, cfg)
    feats = task.train_features(ds.examples, tok, cfg, ds)
    set_seed(t.seed)  # as the loop does right before building the model
    model = task.build_model(cfg, tok, ds, feats)
    p = build_perturbations(cfg.perturb, cfg)[0]
    p.bind(model, tok)
    first = batch_order(feats.lengths, t.batch_size, t.seed, 0, length_grouping=t.length_grouping,
                        group_batches=t.group_batches)[0]
    batch = task.collate(feats, first, tok, with_labels=True)
    gen = batch_generator(t.seed, 0, 0)  # the first epoch's first batch
    with torch.no_grad():
        clean = model(batch, task.targets(batch))["loss"].item()
        shifted = model(p(batch, gen), task.targets(batch))["loss"].item()
    assert abs(log[0]["loss"] - (clean + shifted)) <= 1e-5 * (clean + shifted), (log[0]["loss"], clean, shifted)
    assert abs(log[0]["loss"] - clean) > 0.1  # not the clean loss alone
