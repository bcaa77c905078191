"""posbias/train_state.py, as the training loop uses it: what a resumable checkpoint keeps of a GPU
run (the device's generator, the fp16 loss scaler), checked on the CPU with a stand-in accelerator;
the real CUDA round trip is the `cuda` case of
tests/gpu/test_cuda_paths.py::test_resume_on_device_ends_where_an_uninterrupted_run_ends."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import save_file

from posbias import train_state, training
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
    monkeypatch.setattr(train_state, "save_checkpoint", lambda *a, **k: None)  # the weights are not the point here
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
    monkeypatch.setattr(train_state, "read_trainer_state", lambda path: {"global_step": 3})
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


# ---- resuming with another number of processes


def test_resume_with_another_number_of_processes_is_refused(tmp_path, monkeypatch, capsys):
    """A checkpoint saved by one process, resumed by a run that has two: one line naming both sizes.
    Before, rank 0 took the one saved RNG state and the run went on with another batch order and
    another schedule length (with fewer processes than saved: an IndexError)."""
    from accelerate import Accelerator

    import posbias
    from posbias.cli import main
    from posbias.config import build_config

    from helpers import tiny_config

    d = tiny_config(tmp_path, train={"max_steps": 2, "save_every": 1}, data={"eval_file": None})
    posbias.train(build_config(d), progress=False)
    assert training._read_trainer_state(tmp_path / "run" / "checkpoints" / "last" / "trainer_state.json")[
        "world_size"] == 1

    class TwoProcesses(Accelerator):  # as if started by torchrun --nproc_per_node 2 (this is rank 0)
        num_processes = 2

    monkeypatch.setattr(training, "Accelerator", TwoProcesses)
    cfg = tmp_path / "c.yaml"
    d["train"]["max_steps"] = 4
    cfg.write_text(__import__("json").dumps(d), encoding="utf-8")
    assert main(["train", "qa", "-c", str(cfg), "--resume", "auto"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "saved by 1 process and this run has 2; resume with 1" in err, err


def test_a_checkpoint_from_before_the_world_size_key_is_checked_by_its_random_states(tmp_path, monkeypatch):
    """Checkpoints written before trainer_state.json had world_size: the number of saved per-process
    random states tells (here 1, resumed by 2)."""
    from posbias.errors import ConfigError

    last = _save(tmp_path, monkeypatch, "cpu")
    with pytest.raises(ConfigError, match="saved by 1 process and this run has 2"):
        training._check_world_size(last, 2)
    training._check_world_size(last, 1)


# ---- train.deterministic


def test_deterministic_runs_set_the_flags_for_the_run_only_and_repeat_bit_for_bit(tmp_path, monkeypatch):
    """train.deterministic: during the run torch's deterministic algorithms, cuDNN's deterministic
    kernels without benchmarking and cuBLAS's fixed workspace are on; after it every flag and the
    variable are back as they were; two runs end with the same weights, bit for bit; run_info.json
    records it."""
    import json

    from safetensors.torch import load_file

    import posbias
    from posbias.config import build_config

    from helpers import tiny_config

    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    flags = lambda: (torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.deterministic,  # noqa: E731
                     torch.backends.cudnn.benchmark, __import__("os").environ.get("CUBLAS_WORKSPACE_CONFIG"))
    before = flags()
    assert before[0] is False
    seen, real = [], training.passes_loss

    def recording(*a, **k):
        seen.append(flags())
        return real(*a, **k)

    monkeypatch.setattr(training, "passes_loss", recording)
    for name in ("a", "b"):
        d = tiny_config(tmp_path / name, train={"max_steps": 3, "deterministic": True}, data={"eval_file": None})
        posbias.train(build_config(d), progress=False)
        assert flags() == before
    assert seen and set(seen) == {(True, True, False, ":4096:8")}
    info = json.loads((tmp_path / "a" / "run" / "run_info.json").read_text(encoding="utf-8"))
    assert info["deterministic"] is True
    a = load_file(str(tmp_path / "a" / "run" / "best" / "model.safetensors"))
    b = load_file(str(tmp_path / "b" / "run" / "best" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert build_config(d).hash() == build_config(d, ["train.deterministic=false"]).hash()  # not part of the hash


@pytest.mark.slow
def test_a_one_process_checkpoint_resumed_by_torchrun_with_two_is_refused(tmp_path):
    """The real thing: `posbias train ... --resume auto` in 2 processes of a gloo group (each started as
    torchrun starts a rank) on a one-process run's checkpoint fails with the one line on both, and
    leaves the run as it was (finished at step 2)."""
    import json

    import posbias
    from posbias.config import build_config

    from helpers import tiny_config
    from helpers.ranks import cli_command, run_ranks

    d = tiny_config(tmp_path, train={"max_steps": 2, "save_every": 1}, data={"eval_file": None})
    posbias.train(build_config(d), progress=False)
    d["train"]["max_steps"] = 4
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps(d), encoding="utf-8")
    for rank in run_ranks(cli_command, 2, ["train", "qa", "-c", path, "--resume", "auto"], timeout=300):
        assert rank["code"] == 2
        assert "saved by 1 process and this run has 2; resume with 1" in rank["stderr"], rank["stderr"][-3000:]
    info = json.loads((tmp_path / "run" / "run_info.json").read_text(encoding="utf-8"))
    assert info["status"] == "finished" and info["summary"]["steps"] == 2


def test_deterministic_runs_repeat_bit_for_bit_on_device(device, tmp_path):
    """train.deterministic on the `device` fixture's device (the cuda case: `make gpu-check`): two
    runs with dropout end with equal weights, bit for bit, and the flags are off again after."""
    from safetensors.torch import load_file

    import posbias
    from posbias.config import build_config

    from helpers import tiny_config

    for name in ("a", "b"):
        d = tiny_config(tmp_path / name, train={"max_steps": 3, "deterministic": True, "device": device},
                        data={"eval_file": None})
        posbias.train(build_config(d), progress=False)
    assert not torch.are_deterministic_algorithms_enabled()
    a = load_file(str(tmp_path / "a" / "run" / "best" / "model.safetensors"))
    b = load_file(str(tmp_path / "b" / "run" / "best" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
