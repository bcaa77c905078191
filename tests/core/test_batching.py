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


# ---- collation on a background thread, copies to a GPU

def test_prefetch_gives_every_batch_in_order_from_another_thread():
    import threading

    from posbias.batching import Prefetch

    threads = set()

    def collate(key):
        threads.add(threading.current_thread() is threading.main_thread())
        return {"x": key * 10}

    keys = [5, 3, 3, 9, 0, 7]
    with Prefetch(collate, keys, depth=2) as p:
        assert [p.get(k)["x"] for k in keys] == [50, 30, 30, 90, 0, 70]
    assert threads == {False}


def test_prefetch_raises_the_collation_error_and_stops_early_without_hanging():
    import pytest

    from posbias.batching import Prefetch

    def collate(key):
        if key == 2:
            raise ValueError("bad window 2")
        return {"x": key}

    with Prefetch(collate, [0, 1, 2, 3]) as p:
        assert p.get(0) == {"x": 0} and p.get(1) == {"x": 1}
        with pytest.raises(ValueError, match="bad window 2"):
            p.get(2)
    p = Prefetch(lambda k: {"x": k}, list(range(100)), depth=1)  # the loop stops after one (early stopping)
    assert p.get(0) == {"x": 0}
    p.close()
    assert not p._thread.is_alive()
    with Prefetch(lambda k: {"x": k}, [1, 2]) as p, pytest.raises(RuntimeError, match="asked for batch 2"):
        p.get(2)  # out of order: the loop and the keys disagree


class _StandIn:
    """A CPU tensor's stand-in that records what `move` asks of it (pinning needs a CUDA build)."""

    def __init__(self, pinned=False):
        self.pinned, self.calls = pinned, []

    def is_pinned(self):
        return self.pinned

    def pin_memory(self):
        self.calls.append("pin")
        return _StandIn(pinned=True)

    def to(self, device, non_blocking=False):
        self.calls.append(("to", str(device), non_blocking))
        return self


def test_move_to_cuda_copies_from_pinned_memory_without_blocking():
    import torch

    from posbias.batching import move

    plain, pinned = _StandIn(), _StandIn(pinned=True)
    out = move({"a": plain, "b": pinned}, torch.device("cuda", 1))
    assert plain.calls == ["pin"] and out["a"].pinned and out["a"].calls == [("to", "cuda:1", True)]
    assert pinned.calls == [("to", "cuda:1", True)]  # already pinned (by the prefetch thread): no second copy
    cpu = _StandIn()
    move({"a": cpu}, torch.device("cpu"))
    assert cpu.calls == [("to", "cpu", False)]  # on a CPU: a plain copy, nothing pinned
