"""posbias/training.py: what a resumable checkpoint keeps of a GPU run (the device's generator, the
fp16 loss scaler), checked on the CPU with a stand-in accelerator; the real CUDA round trip is the
`cuda` case of tests/gpu/test_cuda_paths.py::test_resume_on_device_ends_where_an_uninterrupted_run_ends."""
from __future__ import annotations

from types import SimpleNamespace

import torch
from safetensors.torch import save_file

from posbias import training
from posbias.train_state import load_state


class _Scaler:
    """accelerate's GradScaler, as far as a checkpoint sees it."""

    def __init__(self, scale=1024.0, tracker=7):
        self.state = {"scale": scale, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 2000,
                      "_growth_tracker": tracker}

    def state_dict(self):
        return dict(self.state)

    def load_state_dict(self, d):
        self.state = dict(d)


def _parts():
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    return model, optimizer, scheduler


def _save(tmp_path, monkeypatch, device_type: str, scaler=None):
    """_save_last with a stand-in accelerator on `device_type`; returns the checkpoint folder."""
    cuda_state = torch.arange(16, dtype=torch.uint8)
    monkeypatch.setattr(torch.cuda, "get_rng_state", lambda device=None: cuda_state.clone())
    monkeypatch.setattr(training, "save_checkpoint", lambda *a, **k: None)  # the weights are not the point here
    acc = SimpleNamespace(device=torch.device(device_type), is_main_process=True, wait_for_everyone=lambda: None)
    if scaler is not None:
        acc.scaler = scaler
    model, optimizer, scheduler = _parts()
    last = tmp_path / "checkpoints" / "last"
    last.parent.mkdir(parents=True)
    training._save_last(acc, model, optimizer, scheduler, None, None, {"global_step": 3}, last, lambda x: x)
    return last


def test_a_gpu_checkpoint_keeps_the_device_generator_and_the_loss_scaler(tmp_path, monkeypatch):
    last = _save(tmp_path, monkeypatch, "cuda", scaler=_Scaler(scale=512.0, tracker=11))
    state = load_state(last)
    assert torch.equal(state["rng"][0]["cuda"], torch.arange(16, dtype=torch.uint8))
    assert state["scaler"]["scale"] == 512.0 and state["scaler"]["_growth_tracker"] == 11


def test_resume_on_a_gpu_restores_the_device_generator_and_the_loss_scaler(tmp_path, monkeypatch):
    last = _save(tmp_path, monkeypatch, "cuda", scaler=_Scaler(scale=512.0, tracker=11))
    restored = {}
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda s, device=None: restored.update(state=s, device=device))
    monkeypatch.setattr(training, "_read_trainer_state", lambda path: {"global_step": 3})
    model, optimizer, scheduler = _parts()
    save_file(model.state_dict(), str(last / training.WEIGHTS))
    scaler, state = _Scaler(), {}
    updates = SimpleNamespace(counts=[0], steps=0)
    training._load_resume(last, model, optimizer, scheduler, 0, state, updates, device=torch.device("cuda", 0),
                          scaler=scaler)
    assert torch.equal(restored["state"], torch.arange(16, dtype=torch.uint8))
    assert restored["device"] == torch.device("cuda", 0)
    assert scaler.state["scale"] == 512.0 and scaler.state["_growth_tracker"] == 11
    assert state["global_step"] == 3


def test_a_cpu_checkpoint_has_no_device_generator(tmp_path, monkeypatch):
    state = load_state(_save(tmp_path, monkeypatch, "cpu"))
    assert "cuda" not in state["rng"][0] and "scaler" not in state
