"""The training loop reads values off the device only when it must: the losses at a log line,
evaluation or checkpoint, nothing per step (counters come from the host's copy of the batch), and
collation runs on another thread. A host read of a GPU tensor makes the GPU wait on Python.

On this CPU-only machine a GPU is stood in for by `OnDevice`: the batches `training.move` hands to the
model become OnDevice tensors, and so does whatever is computed from them (the loss), and every read
of their values made by posbias code (`.item()`, `.tolist()`, `int()`, `bool()`, `.cpu()`, ...)
is counted. The same check on a real GPU is in `test_no_host_sync_per_step_on_cuda` (gpu marker).
"""
import collections
import json
import os
import sys
import threading

import pytest
import torch

import posbias
from posbias import training
from posbias.config import build_config
from posbias.errors import TrainingError
from posbias.qa.heads import matrix as matrix_mod
from posbias.qa.heads import pointer as pointer_mod

from helpers import tiny_config

READS = ("item", "tolist", "__bool__", "__int__", "__float__", "__index__", "numpy", "cpu")
POSBIAS = os.path.dirname(posbias.__file__)
TORCH = os.path.dirname(torch.__file__)


class OnDevice(torch.Tensor):
    """A tensor standing for one on a GPU: reads of its values by posbias code are counted in `reads`."""

    reads: collections.Counter = collections.Counter()

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in READS:
            frame = sys._getframe(1)
            while frame is not None and frame.f_code.co_filename.startswith(TORCH):
                frame = frame.f_back
            where = frame.f_code.co_filename if frame is not None else ""
            if where.startswith(POSBIAS):  # transformers' own reads are not ours to remove
                cls.reads[(name, os.path.relpath(where, POSBIAS), frame.f_lineno)] += 1
        return super().__torch_function__(func, types, args, kwargs or {})


@pytest.fixture
def on_device(monkeypatch):
    """Every batch the loop moves to the device comes out as OnDevice tensors; the heads act as on a GPU."""
    real = training.move

    def move(batch, device):
        return {k: v.as_subclass(OnDevice) for k, v in real(batch, device).items()}

    monkeypatch.setattr(training, "move", move)
    for m in (pointer_mod, matrix_mod):
        monkeypatch.setattr(m, "reads_wait", lambda t: True, raising=False)  # raising: the code before the seam
    OnDevice.reads.clear()
    return OnDevice.reads


@pytest.mark.parametrize("sections", [
    {"train": {"grad_accum": 2}, "perturb": [{"name": "rpp", "mode": "augment"}]},
    {"model": {"head": "conditional_pointer"}},
    {"model": {"head": "matrix"}},
], ids=["independent-accum-augment", "vcp", "map"])
def test_training_reads_the_device_only_at_log_lines(tmp_path, on_device, sections):
    """Six steps, a log line every third: the losses are read twice (one copy each), nothing else."""
    d = tiny_config(tmp_path, data={"eval_file": None}, **{k: v for k, v in sections.items() if k != "perturb"})
    d["train"].update(max_steps=6, log_every=3)
    d["perturb"] = sections.get("perturb", [])
    posbias.train(build_config(d), progress=False)
    reads = dict(on_device)
    assert sum(reads.values()) == 2 and {name for name, *_ in reads} == {"tolist"}, reads
    lines = [json.loads(x) for x in (tmp_path / "run" / "train_log.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [3, 6]


def test_logged_loss_is_the_mean_of_the_micro_batch_losses(tmp_path, monkeypatch):
    """Read late, the logged loss is still the float64 mean of every micro-batch's loss, to the bit."""
    seen = []
    real = training.passes_loss

    def passes_loss(model, passes, targets):
        loss = real(model, passes, targets)
        seen.append(loss.item())  # the test's own read
        return loss

    monkeypatch.setattr(training, "passes_loss", passes_loss)
    d = tiny_config(tmp_path, data={"eval_file": None})
    d["train"].update(max_steps=5, log_every=2, grad_accum=2)
    posbias.train(build_config(d), progress=False)
    lines = [json.loads(x) for x in (tmp_path / "run" / "train_log.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [2, 4, 5]
    for line, (lo, hi) in zip(lines, [(0, 4), (4, 8), (8, 10)]):
        total = 0.0
        for v in seen[lo:hi]:
            total += v
        assert line["loss"] == total / (hi - lo)


def _nan_at_call(monkeypatch, n: int, then_fail: bool = False):
    calls = {"n": 0}
    real = training.passes_loss

    def passes_loss(model, passes, targets):
        calls["n"] += 1
        if then_fail and calls["n"] > n:  # an op that refuses the NaN weights the bad step left
            raise RuntimeError("probability tensor contains either inf, nan or element < 0")
        loss = real(model, passes, targets)
        return loss * float("nan") if calls["n"] == n else loss

    monkeypatch.setattr(training, "passes_loss", passes_loss)


def test_a_nan_loss_read_at_the_next_checkpoint_names_its_step_and_saves_nothing_after(tmp_path, monkeypatch):
    """Log lines every 10 steps, checkpoints every 2: the NaN of step 3 is found before step 4's
    checkpoint, the error names step 3 and the checkpoint of step 2, which stays the last one."""
    _nan_at_call(monkeypatch, 3)
    d = tiny_config(tmp_path, data={"eval_file": None})
    d["train"].update(max_steps=8, log_every=10, save_every=2)
    with pytest.raises(TrainingError, match=r"loss is nan at step 3; .*checkpoints/last \(step 2\)"):
        posbias.train(build_config(d), progress=False)
    state = json.loads((tmp_path / "run" / "checkpoints/last/trainer_state.json").read_text())
    assert state["global_step"] == 2
    info = json.loads((tmp_path / "run" / "run_info.json").read_text())
    assert info["status"] == "failed" and "step 3" in info["error"]
    assert not (tmp_path / "run" / "best").exists()


def test_a_step_failing_after_a_nan_loss_reports_the_nan(tmp_path, monkeypatch):
    """A later step that fails on the damaged weights, before the loss was read, reports the NaN."""
    _nan_at_call(monkeypatch, 2, then_fail=True)
    d = tiny_config(tmp_path, data={"eval_file": None})
    d["train"].update(max_steps=8, log_every=10)
    with pytest.raises(TrainingError, match=r"loss is nan at step 2; .*no checkpoint was saved"):
        posbias.train(build_config(d), progress=False)


def test_training_collates_off_the_main_thread_in_the_recorded_order(tmp_path, monkeypatch):
    """The micro-batches are collated on another thread, in the order of data_order/, each once."""
    from posbias.qa.task import QATask

    seen = []
    real = QATask.collate

    def collate(self, features, idx, tokenizer, **kw):
        seen.append((threading.current_thread() is threading.main_thread(), idx.tolist()))
        return real(self, features, idx, tokenizer, **kw)

    monkeypatch.setattr(QATask, "collate", collate)
    from posbias import training

    for ahead in (False, True):  # the CPU's default, inline; the thread CUDA runs use
        seen.clear()
        monkeypatch.setattr(training, "collate_ahead", lambda device, ahead=ahead: ahead)
        d = tiny_config(tmp_path, data={"eval_file": None}, train={"output_dir": str(tmp_path / f"run{ahead}")})
        d["train"].update(max_steps=4, batch_size=4)
        posbias.train(build_config(d), progress=False)
        order = json.loads((tmp_path / f"run{ahead}" / "data_order" / "epoch-0.json").read_text())["windows"]
        assert [idx for _, idx in seen] == order[:4]
        assert all(main is not ahead for main, _ in seen), ahead


@pytest.mark.gpu
def test_no_host_sync_per_step_on_cuda(tmp_path, device, monkeypatch):
    """On a GPU, CUDA's own sync detector (warn mode) sees no synchronisation made by posbias code in
    the training steps between log lines (transformers' own, e.g. its SDPA mask check, are not ours)."""
    import warnings

    if device != "cuda":
        pytest.skip("a CPU has no host synchronisation to detect")
    d = tiny_config(tmp_path, data={"eval_file": None}, model={"head": "matrix"})
    d["train"].update(max_steps=6, log_every=3, device="cuda")
    d["perturb"] = [{"name": "rpp", "mode": "augment"}]
    real = training._train_step
    found = []

    def train_step(run, loop, batches):
        if loop.step % 3 == 0:  # the first step after a log line: caches warm up
            return real(run, loop, batches)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                real(run, loop, batches)
            finally:
                torch.cuda.set_sync_debug_mode("default")
        found.extend(f"{w.filename}:{w.lineno}" for w in caught
                     if "synchroniz" in str(w.message) and w.filename.startswith(POSBIAS))

    monkeypatch.setattr(training, "_train_step", train_step)
    posbias.train(build_config(d), progress=False)
    assert not found, found


@pytest.mark.slow
def test_a_nan_loss_on_one_of_two_processes_stops_both_at_the_next_read(tmp_path):
    """Two CPU processes (gloo): rank 1's loss is NaN at step 2; at the next log line (step 4) both
    stop, rank 1 naming its value, rank 0 the other process, both at step 2; nothing hangs."""
    from helpers.ranks import nan_loss_on_rank_1, run_ranks

    d = tiny_config(tmp_path, data={"eval_file": None})
    d["train"].update(max_steps=8, log_every=4)
    zero, one = run_ranks(nan_loss_on_rank_1, 2, d, 2, timeout=300)
    assert zero["raised"] == one["raised"] == "TrainingError"
    assert "the training loss is nan at step 2" in one["message"], one
    assert "the training loss of another process is not finite at step 2" in zero["message"], zero
    info = json.loads((tmp_path / "run" / "run_info.json").read_text())
    assert info["status"] == "failed" and "step 2" in info["error"]
    assert not (tmp_path / "run" / "train_log.jsonl").exists()  # the step-4 line was never written
