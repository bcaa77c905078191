"""--device / train.device: resolution, errors without the hardware, and the option reaching every
command that runs a model (checked by recording what `resolve_device` is asked for)."""
import contextlib
import json
import os

import pytest
import torch

import posbias
import posbias.devices
import posbias.evaluation
import posbias.qa.evaluate
from posbias.cli import main
from posbias.config import build_config
from posbias.devices import resolve_device
from posbias.errors import ConfigError

from helpers import DEMO_DEV, run_cli, tiny_config


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp("dev")
    posbias.train(build_config(tiny_config(out, train={"max_steps": 1})), progress=False)
    return out / "run" / "best"


def test_resolution_and_errors(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu") and resolve_device("cpu") == torch.device("cpu")
    with pytest.raises(ConfigError, match="--device cuda: torch sees no CUDA device"):
        resolve_device("cuda", "--device")
    with pytest.raises(ConfigError, match="train.device must be auto, cpu, cuda, cuda:N or mps, got 'gpu'"):
        build_config(tiny_config(), ["train.device=gpu"])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert resolve_device("auto") == torch.device("cuda")
    with pytest.raises(ConfigError, match="cuda:1: torch sees 1 CUDA device"):
        resolve_device("cuda:1")


def test_device_is_not_part_of_the_config_hash():
    a = build_config(tiny_config())
    assert a.hash() == build_config(tiny_config(), ["train.device=cpu"]).hash()


def test_cuda_without_one_is_a_one_line_error(trained, tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    r = run_cli("evaluate", "qa", "--model", str(trained), "--data", DEMO_DEV, "--device", "cuda")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "torch sees no CUDA device" in r.stderr, r.stderr


def test_device_reaches_every_command(trained, tmp_path, monkeypatch):
    asked = []
    real = posbias.devices.resolve_device

    def recording(spec="auto", key="train.device"):
        asked.append(spec)
        return real("cpu", key)  # run on the CPU whatever was asked

    monkeypatch.setattr(posbias.devices, "resolve_device", recording)
    common = ["--model", str(trained), "--data", DEMO_DEV, "--device", "cuda:1", "data.max_eval_examples=4"]
    assert main(["evaluate", "qa", *common, "--output-dir", str(tmp_path / "ev")]) == 0
    info = json.loads((tmp_path / "ev" / "run_info.json").read_text(encoding="utf-8"))
    assert info["hardware"]["device"] == "cpu" and "cpu" in info["hardware"]
    assert main(["predict", "qa", *common, "--output-dir", str(tmp_path / "pr")]) == 0
    assert main(["diagnose", "qa", *common, "--output-dir", str(tmp_path / "dg")]) == 0
    assert asked and set(asked) == {"cuda:1"}
    asked.clear()
    cfg = tmp_path / "c.yaml"
    cfg.write_text(json.dumps(tiny_config(tmp_path / "t", train={"max_steps": 1})), encoding="utf-8")
    assert main(["train", "qa", "-c", str(cfg), "--device", "cuda:1"]) == 0
    assert asked == ["cuda:1"] or set(asked) == {"cuda:1"}
    info = json.loads((tmp_path / "t" / "run" / "run_info.json").read_text(encoding="utf-8"))
    assert info["hardware"]["device"] == "cpu" and info["mixed_precision"] == "no"



def test_evaluation_sets_the_current_device_to_the_models(trained, tmp_path, monkeypatch):
    """evaluate / predict / diagnose run inside `devices.current(<the model's device>)`, as training
    does: on cuda:N, whatever says only `cuda` then lands on GPU N (recorded here on the CPU, where
    the block does nothing: every command's outputs are written inside it)."""
    entered, inside = [], []
    real_current, real_meta = posbias.devices.current, posbias.evaluation.write_run_meta

    @contextlib.contextmanager
    def current(device):
        entered.append(str(device))
        with real_current(device):
            inside.append(True)
            yield
            inside.pop()

    def meta(*args, **kwargs):
        assert inside, "outputs written outside the device block"
        return real_meta(*args, **kwargs)

    monkeypatch.setattr(posbias.devices, "current", current)
    for module in (posbias.evaluation, posbias.qa.evaluate):
        monkeypatch.setattr(module, "write_run_meta", meta)
    common = ["--model", str(trained), "--data", DEMO_DEV, "--device", "cpu", "data.max_eval_examples=4"]
    for command in ("evaluate", "predict"):
        assert main([command, "qa", *common, "--output-dir", str(tmp_path / command)]) == 0
    assert entered == ["cpu", "cpu"]


@pytest.mark.gpu
def test_evaluation_runs_with_the_current_device_it_names(trained, tmp_path, monkeypatch):
    """On a machine with GPUs: `evaluate --device cuda:N` (the last one) evaluates with N as torch's
    current device, and leaves the current device as it was."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU: torch sees none")
    n = torch.cuda.device_count() - 1
    before, seen = torch.cuda.current_device(), []
    real_meta = posbias.evaluation.write_run_meta

    def meta(*args, **kwargs):
        seen.append(torch.cuda.current_device())
        return real_meta(*args, **kwargs)

    monkeypatch.setattr(posbias.evaluation, "write_run_meta", meta)
    assert main(["evaluate", "qa", "--model", str(trained), "--data", DEMO_DEV, "--device", f"cuda:{n}",
                 "data.max_eval_examples=4", "--output-dir", str(tmp_path / "ev")]) == 0
    assert seen == [n] and torch.cuda.current_device() == before


# ---- training's device: cuda:N, a fresh accelerate state per run, launchers


class _Stop(Exception):
    """Raised by the recording Accelerator once it is made: what it was asked for is the point."""


@pytest.fixture
def record_accelerator(monkeypatch):
    """install() -> a dict: from then on training's Accelerator records its device, its precision,
    torch's current CUDA device (through a stand-in `torch.cuda.device`: this machine may have no
    GPU) and accelerate's ACCELERATE_TORCH_DEVICE, then stops the run; `resolve_device` takes a
    cuda spec as it is, without asking torch for the GPU."""
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    import posbias.training

    seen, current = {}, []

    @contextlib.contextmanager
    def cuda_device(index):
        current.append(index)
        try:
            yield
        finally:
            current.pop()

    class Recording(Accelerator):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            seen.update(device=self.device, precision=self.mixed_precision, current=list(current),
                        env=os.environ.get("ACCELERATE_TORCH_DEVICE"))
            raise _Stop

    real = posbias.devices.resolve_device

    def install():
        monkeypatch.setattr(torch.cuda, "device", cuda_device)
        monkeypatch.setattr(posbias.training, "Accelerator", Recording)
        monkeypatch.setattr(posbias.devices, "resolve_device",
                            lambda spec="auto", key="train.device": torch.device(spec) if "cuda" in spec else real(spec, key))
        return seen

    yield install
    AcceleratorState._reset_state(reset_partial_state=True)  # no stand-in GPU state left for later tests
    assert not current  # the current device was put back


def test_a_run_trains_on_the_gpu_it_names_also_after_a_cpu_run(record_accelerator, tmp_path, monkeypatch):
    """train.device cuda:1 reaches accelerate, and torch's current CUDA device is GPU 1 for the run.
    Before, accelerate was only told "CPU or not" (a single process took GPU 0 whatever N was), and a
    second run in a process kept the first run's device (after a CPU run: the CPU). accelerate's
    environment variable is put back after."""
    monkeypatch.delenv("ACCELERATE_TORCH_DEVICE", raising=False)
    posbias.train(build_config(tiny_config(tmp_path / "cpu", train={"max_steps": 1})), progress=False)
    asked = record_accelerator()
    with pytest.raises(_Stop):
        posbias.train(build_config(tiny_config(tmp_path / "gpu", train={"max_steps": 1, "device": "cuda:1"})),
                      progress=False)
    assert asked["device"] == torch.device("cuda", 1), asked
    assert asked["current"] == [1] and asked["env"] == "cuda:1"
    assert "ACCELERATE_TORCH_DEVICE" not in os.environ


def test_a_cpu_run_after_a_gpu_run_trains_on_the_cpu(tmp_path, monkeypatch):
    """A process whose accelerate state holds a GPU (an earlier run on cuda:1, or the user's own
    Accelerator) trains a CPU run on the CPU: before, accelerate's state kept the GPU and moving the
    model there failed (or, with a GPU, the run silently trained on it)."""
    from accelerate.state import AcceleratorState, PartialState

    monkeypatch.setenv("ACCELERATE_TORCH_DEVICE", "cuda:1")
    assert PartialState().device == torch.device("cuda", 1)  # what an earlier GPU run leaves in the process
    monkeypatch.delenv("ACCELERATE_TORCH_DEVICE")
    try:
        posbias.train(build_config(tiny_config(tmp_path, train={"max_steps": 1})), progress=False)
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)
    info = json.loads((tmp_path / "run" / "run_info.json").read_text(encoding="utf-8"))
    assert info["status"] == "finished" and info["hardware"]["device"] == "cpu"


def test_one_gpu_under_a_launcher_is_a_one_line_error(record_accelerator, tmp_path, monkeypatch, capsys):
    """Under torchrun / `accelerate launch` each process takes its LOCAL_RANK's GPU: train.device
    cuda:N is refused by name (before, it was silently ignored); plain cuda is what such runs use."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert posbias.devices.launched() == 2
    record_accelerator()
    cfg = tmp_path / "c.yaml"
    cfg.write_text(json.dumps(tiny_config(tmp_path, train={"max_steps": 1})), encoding="utf-8")
    assert main(["train", "qa", "-c", str(cfg), "--device", "cuda:1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "train.device cuda:1" in err and "LOCAL_RANK" in err and "2 processes" in err, err
    posbias.devices.check_launch("cuda", 2)  # the GPU of LOCAL_RANK
    posbias.devices.check_launch("cuda:1", 0)  # no launcher: one process, on GPU 1
    monkeypatch.delenv("WORLD_SIZE")
    assert posbias.devices.launched() == 0


@pytest.mark.gpu
def test_training_runs_on_the_last_visible_gpu(tmp_path):
    """On a machine with GPUs: a run on cuda:N (the last one) trains there, says so in run_info.json,
    leaves nothing on GPU 0 and the current device as it was; a CPU run after it trains on the CPU."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU: torch sees none")
    n = torch.cuda.device_count() - 1
    before, on_gpu0 = torch.cuda.current_device(), torch.cuda.memory_allocated(0)
    posbias.train(build_config(tiny_config(tmp_path / "gpu", train={"max_steps": 2, "device": f"cuda:{n}"})),
                  progress=False)
    info = json.loads((tmp_path / "gpu" / "run" / "run_info.json").read_text(encoding="utf-8"))
    assert info["hardware"]["device"] == f"cuda:{n}", info["hardware"]
    assert torch.cuda.current_device() == before
    if n > 0:  # nothing of the run on GPU 0 (other tests in this process may hold tensors there)
        assert torch.cuda.memory_allocated(0) == on_gpu0
    posbias.train(build_config(tiny_config(tmp_path / "cpu", train={"max_steps": 1, "device": "cpu"})),
                  progress=False)
    info = json.loads((tmp_path / "cpu" / "run" / "run_info.json").read_text(encoding="utf-8"))
    assert info["hardware"]["device"] == "cpu"


def test_explain_runs_on_the_device_it_is_given(monkeypatch, tmp_path):
    """`posbias explain attention --device cuda:1` (and the API's device=) ask for that device; before,
    explain had no device and ran on the CPU."""
    asked = []

    def recording(spec="auto", key="train.device"):
        asked.append((spec, key))
        return torch.device("cpu")

    monkeypatch.setattr(posbias.devices, "resolve_device", recording)
    cfg = build_config(tiny_config(tmp_path, model={"head": "dynamic_query"}, train={"max_steps": 1}))
    posbias.train(cfg, progress=False)
    asked.clear()
    assert main(["explain", "attention", "--model", str(tmp_path / "run" / "best"), "--question", "Where?",
                 "--context", "The book is on the desk.", "--output-dir", str(tmp_path / "ex"), "--device",
                 "cuda:1"]) == 0
    assert asked == [("cuda:1", "--device")]
