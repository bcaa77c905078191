"""Batch order (seeded, recorded, method-independent) and dynamic padding."""
import numpy as np
import pytest

import posbias
from posbias.config import build_config
from posbias.batching import batch_order
from posbias.qa.collate import collate
from posbias.qa.features import build_qa_features

from helpers import relative_error, tiny_config


@pytest.fixture(scope="module")
def feats(tokenizer, dev_examples):
    return build_qa_features(dev_examples, tokenizer, max_seq_len=128, stride=48, max_query_len=32,
                             train=True)


def test_order_is_a_function_of_seed_and_epoch(feats):
    a = batch_order(feats.lengths, 8, seed=1, epoch=0)
    b = batch_order(feats.lengths, 8, seed=1, epoch=0)
    c = batch_order(feats.lengths, 8, seed=1, epoch=1)
    d = batch_order(feats.lengths, 8, seed=2, epoch=0)
    flat = lambda bs: np.concatenate(bs).tolist()  # noqa: E731
    assert flat(a) == flat(b) and flat(a) != flat(c) and flat(a) != flat(d)
    assert sorted(flat(a)) == list(range(len(feats)))  # every window exactly once


def test_length_grouping_cuts_padding(feats):
    def padding(batches):
        lens = feats.lengths
        return sum(len(b) * lens[b].max() - lens[b].sum() for b in batches) / sum(len(b) * lens[b].max() for b in batches)

    grouped = padding(batch_order(feats.lengths, 8, 0, 0, length_grouping=True))
    random_order = padding(batch_order(feats.lengths, 8, 0, 0, length_grouping=False))
    assert grouped < random_order / 3


def test_collate_pads_each_batch_to_its_longest(feats):
    idx = np.array([3, 10, 20])
    b = collate(feats, idx, pad_id=0, with_labels=True)
    assert b["input_ids"].shape == (3, feats.lengths[idx].max())
    assert b["attention_mask"].sum(1).tolist() == feats.lengths[idx].tolist()
    left = collate(feats, idx, pad_id=0, padding_side="left", with_labels=True)
    pad = left["pad_left"]
    assert (left["start_positions"] - pad).tolist() == feats.start_positions[idx].tolist()
    for r, w in enumerate(idx):
        assert left["input_ids"][r, pad[r]:].tolist() == feats.input_ids[w].tolist()


def test_same_seed_same_batches_for_every_method(tmp_path):
    """The recorded order depends on the seed only, not on the method's options (here: the head's
    label policy and lr differ, the batches do not)."""
    a = build_config(tiny_config(tmp_path / "a", data={"eval_file": None}, train={"max_steps": 2}))
    b = build_config(tiny_config(tmp_path / "b", data={"eval_file": None}, train={"max_steps": 2, "lr": 0.1}))
    posbias.train(a, progress=False)
    posbias.train(b, progress=False)
    read = lambda p: (p / "run" / "data_order" / "epoch-0.json").read_text(encoding="utf-8")  # noqa: E731
    assert read(tmp_path / "a") == read(tmp_path / "b")


def test_gradient_accumulation_equals_a_bigger_batch(tmp_path, monkeypatch, tokenizer):
    """2 micro-batches of 4 with accumulation == 1 batch of 8 (no dropout, same windows).

    Plain SGD instead of AdamW for this test: Adam's first step is ~lr * sign(grad) and would hide
    a wrong loss scale; with SGD the weight change is proportional to the accumulated gradient.
    """
    import torch
    from safetensors.torch import load_file

    from posbias.qa.model import build_model
    from posbias.utils import set_seed

    monkeypatch.setattr(torch.optim, "AdamW", lambda groups, lr, **kw: torch.optim.SGD(groups, lr=lr))
    no_dropout = {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}
    deltas = {}
    for name, bs, acc in (("big", 8, 1), ("acc", 4, 2), ("half", 4, 1)):
        d = tiny_config(tmp_path / name, data={"eval_file": None},
                        train={"max_steps": 1, "batch_size": bs, "grad_accum": acc, "length_grouping": False,
                               "warmup_ratio": 0.0, "max_grad_norm": 0.0, "lr": 1.0})
        d["model"]["encoder"].update(no_dropout)
        cfg = build_config(d)
        posbias.train(cfg, progress=False)
        set_seed(cfg.train.seed)  # the training run's initial weights
        w0 = build_model(cfg.model, tokenizer, null_answer=False).state_dict()
        w1 = load_file(str(tmp_path / name / "run" / "best" / "model.safetensors"))
        deltas[name] = torch.cat([(w1[k] - w0[k]).flatten() for k in w0])
    # float32 training: the two sums of gradients round differently (and differently on each CPU),
    # so the error is measured against the update's own scale.
    acc_err, half_err = relative_error(deltas["acc"], deltas["big"]), relative_error(deltas["half"], deltas["big"])
    assert acc_err < 1e-4, acc_err
    # ... while half the batch alone is a different step (the comparison can fail).
    assert half_err > 1e-2, half_err
