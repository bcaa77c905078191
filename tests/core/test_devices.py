"""--device / train.device: resolution, errors without the hardware, and the option reaching every
command that runs a model (checked by recording what `resolve_device` is asked for)."""
import json

import pytest
import torch

import posbias
import posbias.devices
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
