"""Randomized Positional Encodings (Ruoss et al., ACL 2023, §3) as the third sampler of the position
shift: sorted random ids within the table, [CLS] at its base, padding at the pad id, the same ids for
left and right padding, reproducible per seed, spread over the whole range (not a shift); a tiny QA
and a tiny tagging run train with it; bad options are refused by key; wrong samplers fail the checks."""
import json
import math

import numpy as np
import pytest
import torch

from posbias.config import build_config, config_from
from posbias.errors import ConfigError
from posbias.perturb import build_perturbations, position_coverage, training_passes
from posbias.perturb.position_shift import (PositionShift, sample_randomized_positions, sample_rpp,
                                            shift_position_ids)
from posbias.tagging.model import TaggerModel

from helpers import tiny_config

ENCODERS = [("bert", {"max_position_embeddings": 64}, 0),  # base 0, pad id 0
            ("roberta", {"max_position_embeddings": 66, "pad_token_id": 1}, 1)]  # base 2, pad id 1


def tiny_tagger(model_type="bert", **kw):
    from transformers import AutoConfig, AutoModel

    torch.manual_seed(0)
    cfg = AutoConfig.for_model(model_type, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                               intermediate_size=64, vocab_size=120, **kw)
    return TaggerModel(AutoModel.from_config(cfg, add_pooling_layer=False), ["O", "B-x", "I-x"], "iob2",
                       dropout=0.0).eval()


def build(spec: dict, model=None, max_seq_len=128):
    """The perturbation of `spec` in the tiny tagging config (bound to `model` when given)."""
    cfg = build_config(config_from("tiny_tagging", [f"data.max_seq_len={max_seq_len}"]).to_dict() | {"perturb": [spec]})
    (p,) = build_perturbations(cfg.perturb, cfg)
    if model is not None:
        p.bind(model)
    return p


def rows(lengths, pad_id: int, side: str, with_cls) -> dict:
    """A batch of rows of `lengths` real tokens padded on `side`; `with_cls` (b,) bool."""
    lengths = torch.as_tensor(lengths)
    s = int(lengths.max())
    slots = torch.arange(s)[None]
    pad_left = s - lengths if side == "left" else torch.zeros_like(lengths)
    mask = ((slots >= pad_left[:, None]) & (slots < (pad_left + lengths)[:, None])).long()
    return {"input_ids": torch.where(mask.bool(), 7, pad_id), "attention_mask": mask,
            "cls_index": torch.where(torch.as_tensor(with_cls), pad_left, -1)}


def random_rows(rng, max_len: int, pad_id: int, side: str) -> dict:
    """1-6 rows of 1..max_len real tokens (often one at the limit), ~20% without a leading special."""
    b = int(rng.integers(1, 7))
    lengths = rng.integers(1, max_len + 1, size=b)
    if rng.random() < 0.3:
        lengths[int(rng.integers(0, b))] = max_len
    return rows(torch.from_numpy(lengths), pad_id, side, torch.from_numpy(rng.random(b) < 0.8))


def violations(batch: dict, out: dict, *, base: int, pad_position: int, n_pos: int, max_len: int) -> list[str]:
    """Every required property a row breaks, as messages (none for a correct output)."""
    errors = []
    mask = batch["attention_mask"].bool()
    pos = out["position_ids"]
    for r in range(len(mask)):
        real = pos[r][mask[r]]  # the real tokens' ids, in order
        if (pos[r][~mask[r]] != pad_position).any():
            errors.append(f"row {r}: padding not at the pad position {pad_position}")
        if int(real.max()) >= n_pos:
            errors.append(f"row {r}: position {int(real.max())} overflows the table ({n_pos})")
        f = int(batch["cls_index"][r] >= 0)
        if f and int(pos[r, batch["cls_index"][r]]) != base:
            errors.append(f"row {r}: [CLS] moved to {int(pos[r, batch['cls_index'][r]])}")
        if len(real) > 1 and not (real.diff() > 0).all():
            errors.append(f"row {r}: ids not strictly increasing")
        moved = real[f:]
        if len(moved) and not (base + f <= int(moved.min()) and int(moved.max()) <= base + max_len - 1):
            errors.append(f"row {r}: ids outside [{base + f}, {base + max_len - 1}]")
    return errors


def run_random(p, extra, pad_id, draws=300, seed=0) -> list[str]:
    """`p` over `draws` random batches (alternately left and right padding): every violation; the
    input batch is never modified."""
    rng = np.random.default_rng(seed)
    g = torch.Generator().manual_seed(seed)
    errors = []
    for i in range(draws):
        batch = random_rows(rng, p.max_len, pad_id, "left" if i % 2 else "right")
        before = {k: v.clone() for k, v in batch.items()}
        out = p(batch, g)
        assert all(torch.equal(before[k], batch[k]) for k in before) and "position_ids" not in batch
        errors += violations(batch, out, base=p.base, pad_position=p.pad_position,
                             n_pos=extra["max_position_embeddings"], max_len=p.max_len)
    return errors


@pytest.mark.parametrize("model_type, extra, pad_id", ENCODERS)
def test_sorted_within_the_table_cls_at_base_pads_at_pad(model_type, extra, pad_id):
    """Property over random rows up to the whole range (left and right padding, with and without
    [CLS]), BERT (base 0) and RoBERTa (base 2, pad id 1): no violation; M defaults to the usable
    table as for RPP."""
    model = tiny_tagger(model_type, **extra)
    p = build({"name": "randomized_positions"}, model, max_seq_len=64)
    assert (p.base, p.max_len) == ((2, 64) if model_type == "roberta" else (0, 64))
    assert run_random(p, extra, pad_id) == []
    small = build({"name": "randomized_positions", "max_len": 40}, model, max_seq_len=40)
    assert run_random(small, extra, pad_id, draws=100) == []


def test_left_and_right_padding_give_the_same_ids():
    lengths, with_cls = torch.tensor([3, 17, 30, 9]), torch.tensor([True, True, False, True])
    p = build({"name": "randomized_positions", "max_len": 64}, max_seq_len=64)
    ids = {}
    for side in ("left", "right"):
        batch = rows(lengths, 0, side, with_cls)
        out = p(batch, torch.Generator().manual_seed(4))
        ids[side] = [out["position_ids"][r][batch["attention_mask"][r].bool()].tolist() for r in range(4)]
    assert ids["left"] == ids["right"]


def test_reproducible_per_seed():
    p = build({"name": "randomized_positions", "max_len": 128})
    batch = rows(torch.tensor([20, 50, 7]), 0, "right", torch.tensor([True, True, True]))
    a, b, c = (p(batch, torch.Generator().manual_seed(s))["position_ids"] for s in (11, 11, 12))
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_ids_cover_the_range_and_are_not_a_shift():
    """4,000 rows of l = 9 ([CLS] + 8), M = 64: each of the ids 1 .. 63 is drawn with probability
    8/63 per row (counts within 15% of 4000 * 8 / 63), the first moved id has the mean of the
    minimum of a uniform 8-subset of {1..63}, (63 + 1) / (8 + 1), consecutive gaps vary within rows,
    and almost no row is a plain shift (consecutive ids). RPP, a shift, fails the last two."""
    n, l, m = 4000, 9, 64
    batch = rows(torch.full((n,), l), 0, "right", torch.ones(n, dtype=torch.bool))
    p = build({"name": "randomized_positions", "max_len": m}, max_seq_len=64)
    pos = p(batch, torch.Generator().manual_seed(0))["position_ids"]  # (n, l)
    assert (pos[:, 0] == 0).all()
    counts = torch.bincount(pos[:, 1:].reshape(-1), minlength=m)
    expected = n * (l - 1) / (m - 1)
    assert counts[0] == 0 and 0.85 * expected < int(counts[1:].min()) and int(counts[1:].max()) < 1.15 * expected
    first = pos[:, 1].double()
    sd = first.std().item() / math.sqrt(n)
    assert abs(first.mean().item() - m / l) < 4 * sd, (first.mean().item(), m / l)
    assert not gaps_are_a_shift(pos[:, 1:])

    rpp = PositionShift(sample_rpp, m, "perturb[0]")
    assert gaps_are_a_shift(rpp(batch, torch.Generator().manual_seed(0))["position_ids"][:, 1:])


def gaps_are_a_shift(moved: torch.Tensor) -> bool:
    """True when the rows' consecutive gaps do not vary (every row consecutive: one shift per row),
    or more than 1% of the rows are consecutive."""
    gaps = moved.diff(dim=-1)  # (n, l - 2)
    consecutive = (gaps == 1).all(-1).double().mean().item()
    return len(gaps.unique()) == 1 or consecutive > 0.01


def test_position_coverage_reaches_the_whole_table():
    """`position_coverage` (replace, the default; M = 512, the table, given since nothing is bound):
    [CLS] once per row at 0, every other id of the table reached by rows of 8-40 tokens; the clean
    positions are not favoured."""
    cfg = build_config(tiny_config() | {"perturb": [{"name": "randomized_positions", "max_len": 512}]})
    replace, augment = [build_perturbations(cfg.perturb, cfg)[0]], []
    lengths = torch.randint(8, 41, (3000,), generator=torch.Generator().manual_seed(0))
    counts = position_coverage(lengths, replace, augment, n_positions=512, generator=torch.Generator().manual_seed(1))
    assert counts[0] == 3000 and int(counts[1:].min()) > 0 and int(counts.sum()) == int(lengths.sum())
    assert counts[1:8].float().mean() < 3 * counts[100:400].float().mean()


def _unsorted(lengths, has_cls, max_len, gen):
    """Wrong: the random subset in draw order, not sorted."""
    f = has_cls.long()
    width = int((lengths - f).max())
    keys = torch.rand((len(lengths), max_len), generator=gen, dtype=torch.float64)
    keys = keys.masked_fill(torch.arange(max_len) >= (max_len - f)[:, None], 2.0)
    return keys.argsort(-1)[:, :width] - torch.arange(width)


def _past_the_range(lengths, has_cls, max_len, gen):
    """Wrong: ids drawn from one past the range (M + 1), forgetting the base of the table."""
    return sample_randomized_positions(lengths, has_cls, max_len + 1, gen)


@pytest.mark.parametrize("wrong, caught_by", [(_unsorted, "not strictly increasing"), (_past_the_range, "outside")])
def test_a_wrong_sampler_fails_the_checks(wrong, caught_by):
    _, extra, pad_id = ENCODERS[1]
    p = PositionShift(wrong, None, "perturb[0]", fallback_len=64)
    p.bind(tiny_tagger("roberta", **extra))
    errors = run_random(p, extra, pad_id, draws=100)
    assert any(caught_by in e for e in errors), errors[:3]


def test_a_sampler_that_moves_cls_fails_the_checks():
    """Wrong: [CLS] drawn with the other tokens (the row taken as having no leading special)."""
    _, extra, pad_id = ENCODERS[0]
    p = build({"name": "randomized_positions"}, tiny_tagger("bert", **extra), max_seq_len=64)

    def moves_cls(batch, gen):
        return p({**batch, "cls_index": torch.full_like(batch["cls_index"], -1)}, gen)

    moves_cls.base, moves_cls.pad_position, moves_cls.max_len = p.base, p.pad_position, p.max_len
    errors = run_random(moves_cls, extra, pad_id, draws=100)
    assert any("[CLS] moved" in e for e in errors), errors[:3]


def test_per_token_shifts_equal_per_row_shifts_when_constant():
    """The generalised mechanism: (b, r) shifts all equal to k give exactly the (b,) shift k path
    (left and right padding, with and without [CLS])."""
    for side in ("left", "right"):
        batch = rows(torch.tensor([1, 5, 12, 8]), 1, side, torch.tensor([True, True, False, True]))
        k = torch.tensor([3, 0, 7, 40])
        one = shift_position_ids(batch["attention_mask"], batch["cls_index"], k, base=2, pad_position=1)
        per_token = shift_position_ids(batch["attention_mask"], batch["cls_index"], k[:, None].expand(4, 12),
                                       base=2, pad_position=1)
        assert torch.equal(one, per_token)


@pytest.mark.parametrize("perturb, default, modes", [
    ([{"name": "randomized_positions"}], "paper", ["replace"]),
    ([{"name": "randomized_positions", "mode": "augment"}], "paper", ["augment"]),
    ([{"name": "randomized_positions"}], "augment", ["augment"]),
])
def test_mode_defaults_to_replace_as_in_the_paper(perturb, default, modes):
    cfg = build_config(tiny_config(data={"perturb_default_mode": default}) | {"perturb": perturb})
    assert [m for _, m in build_perturbations(cfg.perturb, cfg, with_modes=True)] == modes


def test_augment_pass_is_the_clean_batch_plus_randomized_copy():
    p = build({"name": "randomized_positions", "mode": "augment"})
    batch = rows(torch.tensor([6, 9]), 0, "right", torch.tensor([True, True]))
    passes = training_passes(batch, [], [p], torch.Generator().manual_seed(0))
    assert len(passes) == 2 and "position_ids" not in passes[0] and passes[1]["position_ids"].shape == (2, 9)


@pytest.mark.parametrize("spec, match", [
    ({"name": "randomized_positions", "cap": 3}, r"^perturb\[0\]: unknown option 'cap' for randomized_positions"),
    ({"name": "randomized_positions", "max_len": 0}, r"^perturb\[0\]\.max_len must be a positive integer, got 0"),
    ({"name": "randomized_positions", "max_len": -5}, r"^perturb\[0\]\.max_len must be a non-negative integer"),
    ({"name": "randomized_positions", "max_len": "all"}, r"^perturb\[0\]\.max_len must be a non-negative integer"),
    ({"name": "randomized_positions", "max_len": True}, r"^perturb\[0\]\.max_len must be a non-negative integer"),
    ({"name": "randomized_positions", "max_len": 100},
     r"^perturb\[0\]\.max_len \(100\) must be >= data\.max_seq_len \(128\)"),
    ({"name": "randomized_positions", "mode": "both"}, r"^perturb\[0\]\.mode must be one of"),
])
def test_bad_options_are_refused_by_key(spec, match):
    with pytest.raises(ConfigError, match=match):
        build_config(tiny_config() | {"perturb": [spec]})


def test_range_past_the_table_and_rows_longer_than_the_range_are_refused():
    model = tiny_tagger("roberta", max_position_embeddings=66, pad_token_id=1)  # usable table 64
    with pytest.raises(ConfigError, match=r"^perturb\[0\]\.max_len \(65\) \+ first position id \(2\) exceeds "
                                          r"the encoder's max_position_embeddings \(66\)"):
        build({"name": "randomized_positions", "max_len": 65}, model, max_seq_len=64)
    p = build({"name": "randomized_positions", "max_len": 64}, model, max_seq_len=64)
    p(rows(torch.tensor([64, 3]), 1, "right", torch.tensor([True, False])), torch.Generator())  # fits exactly
    with pytest.raises(ConfigError, match=r"^perturb\[0\]\.max_len: a row of 65 tokens has fewer than that many "
                                          r"position ids in max_len = 64"):
        p(rows(torch.tensor([65, 3]), 1, "right", torch.tensor([True, True])), torch.Generator())


def test_relative_position_encoders_are_refused_the_same_way():
    model = tiny_tagger("bert", position_embedding_type="relative_key", max_position_embeddings=64)
    p = build({"name": "randomized_positions"}, max_seq_len=64)
    with pytest.raises(ConfigError, match=r"^perturb\[0\]: bert uses relative positions"):
        p.bind(model)


def test_refused_before_a_replace_context_perturbation():
    """It sets position ids like RPP: a replace Context Perturbation after it would drop them."""
    with pytest.raises(ConfigError, match=r"^perturb\[1\]: context_perturbation \(mode replace\) rebuilds"):
        build_config(config_from("tiny_tagging").to_dict() | {"perturb": [
            {"name": "randomized_positions"}, {"name": "context_perturbation", "mode": "replace"}]})


def _losses(out) -> list[float]:
    return [json.loads(x)["loss"] for x in (out / "train_log.jsonl").read_text(encoding="utf-8").splitlines()]


def test_a_tiny_qa_run_trains_with_it(tmp_path):
    import posbias

    cfg = build_config(tiny_config(tmp_path, data={"eval_file": None}, train={"max_steps": 2})
                       | {"perturb": [{"name": "randomized_positions"}]})
    assert posbias.train(cfg, progress=False)["steps"] == 2
    losses = _losses(tmp_path / "run")
    assert losses and all(math.isfinite(x) for x in losses)
    counts = json.loads((tmp_path / "run" / "position_updates.json").read_text(encoding="utf-8"))["counts"]
    assert counts[0] == 2 and sum(counts[128:]) > 0  # [CLS] at 0; ids past the window, up to the table


def test_a_tiny_tagging_run_trains_with_it(tmp_path):
    import posbias

    out = tmp_path / "run"
    cfg = config_from("tiny_tagging", [f"train.output_dir={out}", "train.max_steps=2", "train.log_every=1",
                                       "data.eval_file=null", "perturb=[{name: randomized_positions}]"])
    posbias.train(cfg, progress=False)
    losses = _losses(out)
    assert len(losses) == 2 and all(math.isfinite(x) for x in losses)
    counts = json.loads((out / "position_updates.json").read_text(encoding="utf-8"))["counts"]
    assert counts[0] == 2 and sum(counts[128:]) > 0
