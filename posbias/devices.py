"""Where a model runs: `train.device` / `--device` (`auto`, `cpu`, `cuda`, `cuda:N`, `mps`)."""
from __future__ import annotations

import contextlib
import gc
import os
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


def check_gpus(indices: list[str], key: str = "--gpus") -> None:
    """GPU indices to give processes one each (`CUDA_VISIBLE_DEVICES`), refused before any starts
    when torch sees fewer GPUs. Where this process's own `CUDA_VISIBLE_DEVICES` hides some, an index
    names a GPU of the whole machine, which torch here cannot count: then only "none" is refused."""
    import torch

    count = torch.cuda.device_count()
    build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
    if count == 0:
        raise ConfigError(f"{key} {','.join(indices)}: torch sees no CUDA device (torch {torch.__version__}, {build}); "
                          f"leave out {key}, or add --device cpu to run the lanes on the CPU")
    beyond = [i for i in indices if int(i) >= count]
    if beyond and os.environ.get("CUDA_VISIBLE_DEVICES") is None:
        raise ConfigError(f"{key} {','.join(indices)}: GPU {beyond[0]} is not there; torch sees {count} CUDA "
                          f"device(s), 0 to {count - 1}")


def describe(device) -> dict:
    """The hardware a run used, for run_info.json."""
    import torch

    out = {"device": str(device), "cpu": cpu_name(), "torch_threads": torch.get_num_threads()}
    if device.type == "cuda":
        out["gpu"] = torch.cuda.get_device_name(device)
    return out


def launched() -> int:
    """The number of processes a launcher started this one with (torchrun and multi-process `accelerate
    launch` set WORLD_SIZE; a process group already made counts its ranks); 0 when no launcher did (a
    plain process, or a single-process `accelerate launch`, which sets no WORLD_SIZE)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    try:
        return max(1, int(os.environ["WORLD_SIZE"]))
    except (KeyError, ValueError):
        return 0


def end_launch(ok: bool) -> None:
    """End the process group a launcher's run made (accelerate's PartialState), as the last thing a
    command does, so that no gloo thread lives on into interpreter exit.

    A gloo worker drops a finished collective's tensors on its own thread, after the collective
    returned; when Python no longer holds them, that needs the GIL. Left to interpreter exit, the
    worker could need it while Python was finalizing and the process aborted ("terminate called
    without an active exception": about 1 run in 8 of a 2-process CPU run on 2 busy cores). Ending
    the group joins those threads, but only with the GIL released: freed by the training run's DDP
    wrapper (its reducer holds the group), the group's destructor joins a worker that waits for the
    GIL the destructor holds, and the process hangs (1 run in 50). So the group is ended from a
    reference held here: the runs' wrappers are collected first, then this last reference goes
    through torch's binding, which releases the GIL while the threads are joined.

    After a success every process first waits for the others (a barrier), so none tears its end down
    while another still talks to it; after a failure it does not wait (the others may never come)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return
    group = dist.distributed_c10d._get_default_group()
    if ok:
        dist.barrier()
    dist.destroy_process_group()
    gc.collect()  # the training run's DDP wrapper and reducer, which also hold the group
    del group  # the last reference: the group's destructor joins its threads without the GIL


def check_launch(spec: str, processes: int, key: str = "train.device") -> None:
    """Under a launcher each process takes the GPU of its LOCAL_RANK (accelerate's rule), so an
    explicit `cuda:N`, one GPU for every process, is refused rather than silently ignored."""
    if processes and spec.startswith("cuda:"):
        raise ConfigError(f"{key} {spec} names one GPU, but this run was started by a launcher (torchrun / "
                          f"accelerate launch, {processes} process{'es' if processes > 1 else ''}), where each "
                          f"process trains on the GPU of its LOCAL_RANK: use {key}=cuda or auto, and "
                          "CUDA_VISIBLE_DEVICES to choose the GPUs")


@contextlib.contextmanager
def current(device):
    """torch's current CUDA device is `device` (cuda:N) inside the block, and what it was after.

    Everything that says only `cuda` (a kernel library's handle, an allocator, a third party's
    `torch.device("cuda")`) then lands on GPU N, not GPU 0. `torch.cuda.device` puts the old device
    back without creating a CUDA context on it, so a process that only ever used GPU N holds no
    memory on GPU 0. Other devices: nothing to do."""
    if device.type != "cuda" or device.index is None:
        yield
        return
    import torch

    with torch.cuda.device(device.index):
        yield


@contextlib.contextmanager
def environ(values: dict):
    """os.environ with `values` set inside the block (None: unset), each put back after."""
    old = {k: os.environ.get(k) for k in values}
    try:
        for k, v in values.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


# cuBLAS's documented setting for reproducible results (CUDA >= 10.2): a fixed workspace per stream.
CUBLAS_WORKSPACE = ":4096:8"


@contextlib.contextmanager
def deterministic(on: bool):
    """`train.deterministic`: inside the block torch uses only deterministic algorithms (an op that has
    none raises, naming itself), cuDNN picks deterministic kernels and no benchmarked ones, and cuBLAS
    gets a fixed workspace (CUBLAS_WORKSPACE_CONFIG, when the environment sets none), so that a GPU
    run repeats bit for bit; after it, every flag and the variable are what they were. Off: nothing.

    cuBLAS reads the variable when it makes a workspace: a process that used cuBLAS before should set
    it in its environment before starting (torch then refuses the non-deterministic path by name)."""
    if not on:
        yield
        return
    import torch

    before = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
              torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark)
    workspace = {} if os.environ.get("CUBLAS_WORKSPACE_CONFIG") else {"CUBLAS_WORKSPACE_CONFIG": CUBLAS_WORKSPACE}
    try:
        with environ(workspace):
            torch.use_deterministic_algorithms(True)
            torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
            yield
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = before[2], before[3]
