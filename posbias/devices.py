"""Where a model runs: `train.device` / `--device` (`auto`, `cpu`, `cuda`, `cuda:N`, `mps`)."""
from __future__ import annotations

import re

from .errors import ConfigError
from .utils import cpu_name

DEVICE_PATTERN = re.compile(r"auto|cpu|mps|cuda(:\d+)?")


def check_device_spec(spec: str, key: str = "train.device") -> None:
    if not isinstance(spec, str) or not DEVICE_PATTERN.fullmatch(spec):
        raise ConfigError(f"{key} must be auto, cpu, cuda, cuda:N or mps, got {spec!r}")


def resolve_device(spec: str = "auto", key: str = "train.device"):
    """The torch.device for `spec`: `auto` is the first CUDA GPU when torch sees one, else the CPU;
    an explicit accelerator that torch cannot see is an error naming `key`."""
    import torch

    check_device_spec(spec, key)
    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if spec.startswith("cuda"):
        if not torch.cuda.is_available():
            build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
            raise ConfigError(f"{key} {spec}: torch sees no CUDA device (torch {torch.__version__}, {build}); "
                              "use cpu or auto")
        index = int(spec.split(":")[1]) if ":" in spec else 0
        if index >= torch.cuda.device_count():
            raise ConfigError(f"{key} {spec}: torch sees {torch.cuda.device_count()} CUDA device(s)")
    if spec == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise ConfigError(f"{key} mps: torch sees no Apple MPS device; use cpu or auto")
    return torch.device(spec)


def describe(device) -> dict:
    """The hardware a run used, for run_info.json."""
    import torch

    out = {"device": str(device), "cpu": cpu_name(), "torch_threads": torch.get_num_threads()}
    if device.type == "cuda":
        out["gpu"] = torch.cuda.get_device_name(device)
    return out
