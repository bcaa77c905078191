"""Which device a test runs on: the `device` fixture (cpu, and cuda where torch sees a GPU) and the
rule that keeps every other test on the CPU, also on a machine with a GPU.

Why the rule: `train.device` and `--device` default to `auto`, the first CUDA GPU when torch sees one,
and evaluating a checkpoint always starts from `auto` (`posbias.evaluation.eval_config`). On a GPU box
the ordinary suite would then move onto CUDA, where the tests that assert CPU exactness (resume ends
with the same weights, float32 parity, bit-equal reloads) need not hold. So, explicitly:
- in this process, `posbias.devices.resolve_device("auto")` is the CPU for every test that does not
  ask for the `device` fixture (`auto_device_is_cpu`, autouse in conftest); an explicit `cpu`,
  `cuda`, `cuda:N` is resolved as given;
- `tiny_config()` (helpers) writes `train.device: cpu`, so the configs tests hand to a subprocess
  (`posbias train -c`, torchrun) train on the CPU too;
- `run_cli` hides the GPUs from its subprocess (`CUDA_VISIBLE_DEVICES=""`) unless called with gpu=True.
Tests over the `device` fixture pass that device explicitly (`train.device=...`, `--device ...`).
On a CPU-only machine none of this changes anything: `auto` is the CPU there already.
"""
from __future__ import annotations

import pytest
import torch

import posbias.devices

# The cuda case is marked `gpu` (`pytest -m gpu` selects only it) and skips where torch sees no
# GPU. The skip is decided when the test runs, not at collection: collecting never initialises CUDA.
DEVICES = [pytest.param("cpu", id="cpu"), pytest.param("cuda", id="cuda", marks=pytest.mark.gpu)]
CPU_ONLY_ENV = {"CUDA_VISIBLE_DEVICES": ""}


@pytest.fixture(params=DEVICES)
def device(request) -> str:
    """"cpu" or "cuda": where the test runs its model (pass it as train.device / --device)."""
    if request.param == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU: torch sees none")
    return request.param


@pytest.fixture(autouse=True)
def auto_device_is_cpu(request, monkeypatch):
    """`auto` resolves to the CPU, except in tests over the `device` fixture (see the module docstring)."""
    if "device" in request.fixturenames:
        yield
        return
    real = posbias.devices.resolve_device

    def resolve_device(spec="auto", key="train.device"):
        return real("cpu" if spec == "auto" else spec, key)

    monkeypatch.setattr(posbias.devices, "resolve_device", resolve_device)
    yield


@pytest.fixture(autouse=True)
def accelerate_precision_unset(monkeypatch):
    """Training's default precision is accelerate's launch flag or config (ACCELERATE_MIXED_PRECISION,
    `posbias.precision.training_precision`), else fp32: unset here, so that a shell or GPU box that
    sets it does not change what the tests expect. A test about it sets it itself."""
    monkeypatch.delenv("ACCELERATE_MIXED_PRECISION", raising=False)
