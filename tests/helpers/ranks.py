"""Several CPU processes in one gloo group, for the tests of what posbias does per rank
(tests/core/test_multiprocess.py): `run_ranks(fn, world)` runs the module-level `fn(rank, world, *args)`
in `world` new processes (`_context`), each with the environment torchrun gives (RANK, WORLD_SIZE,
MASTER_ADDR/PORT), and returns each rank's result; a process that has not finished within
`timeout` seconds (a hang in a collective) is killed and reported. `group=False` starts independent
processes the same way (several `posbias` commands on one folder).
"""
from __future__ import annotations

import os
import queue
import socket
import traceback

import torch.multiprocessing as mp


class RanksHung(AssertionError):
    """Some rank did not finish in time: a collective that not every rank entered."""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _worker(rank: int, world: int, port: int | None, fn, args, results) -> None:
    if port is not None:  # a rank of a group, as torchrun starts it
        os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world),
                          MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    os.environ.update(OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", CUDA_VISIBLE_DEVICES="")
    import torch

    torch.set_num_threads(1)
    try:
        results.put((rank, "ok", fn(rank, world, *args)))
    except BaseException:  # noqa: BLE001 - reported to the test, with its traceback
        results.put((rank, "error", traceback.format_exc()))
    finally:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


# What the rank bodies below import, loaded once by the forkserver (see `_context`).
_PRELOAD = ["torch", "torch.distributed", "accelerate", "transformers.modeling_utils", "helpers", "helpers.ranks",
            "posbias.training", "posbias.qa.model", "posbias.qa.evaluate", "posbias.hf", "posbias.cli"]


def _context():
    """forkserver where the platform has one: its server, a fresh single-threaded interpreter started
    once per test process, imports `_PRELOAD`, and every rank forks from it, instead of importing torch,
    transformers and posbias anew as a spawned process does (about 5 s of CPU a rank). spawn elsewhere.
    A rank gets the environment of the moment the server started plus what `_worker` sets."""
    import multiprocessing

    if "forkserver" not in multiprocessing.get_all_start_methods():
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(_PRELOAD)
    return ctx


def run_ranks(fn, world: int = 2, *args, timeout: float = 120.0, group: bool = True) -> list:
    """[fn(0, world, *args), ..., fn(world - 1, world, *args)], each in its own process of a gloo
    group (set up by `fn`, e.g. through `accelerate.PartialState(cpu=True)`); with `group=False`,
    independent processes, without torchrun's environment (several users of one folder)."""
    ctx = _context()
    results = ctx.Queue()
    port = _free_port() if group else None
    procs = [ctx.Process(target=_worker, args=(r, world, port, fn, args, results), daemon=True) for r in range(world)]
    for p in procs:
        p.start()
    got: dict = {}
    try:
        while len(got) < world:
            try:
                rank, status, value = results.get(timeout=timeout)
            except queue.Empty:
                missing = sorted(set(range(world)) - set(got))
                raise RanksHung(f"rank(s) {missing} did not finish within {timeout:.0f} s") from None
            if status == "error":
                raise AssertionError(f"rank {rank} failed:\n{value}")
            got[rank] = value
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():  # hung in a collective: end the processes this call started
                p.kill()
                p.join()
    return [got[r] for r in range(world)]


# ---- per-rank bodies (module level: a spawned process imports them by name)

def evaluate_few_windows(rank: int, world: int, n_examples: int) -> dict:
    """The QA evaluation of a DDP-prepared tiny model on `n_examples` demo questions (one window
    each: fewer windows than ranks when n_examples < world), as training evaluates."""
    from accelerate import Accelerator

    from posbias.config import build_config
    from posbias.qa.evaluate import eval_features
    from posbias.tasks import get_task

    from helpers import DEMO_DEV, tiny_config, tiny_model

    acc = Accelerator(cpu=True)
    task = get_task("qa")
    cfg = build_config(tiny_config(data={"eval_file": DEMO_DEV, "max_seq_len": 384}))
    tok = task.load_tokenizer(cfg)
    ds = task.read(DEMO_DEV, cfg)
    ds.examples = ds.examples[:n_examples]
    model = acc.prepare(tiny_model(tok))  # wrapped for DDP, as training's model is
    windows = len(eval_features(ds.examples, tok, cfg, source=ds.path))
    result = task.evaluate(model, tok, cfg, ds, accelerator=acc, progress=False)
    return {"windows": windows, **{k: result[k] for k in ("total", "f1")}}


def merged_update_counts(rank: int, world: int, seen: list) -> dict:
    """A PositionUpdateCounter fed `seen[rank]` (per step: the position ids this rank saw), merged
    over the ranks."""
    import torch
    from accelerate import PartialState
    from accelerate.utils import gather_object

    from posbias.analysis.updates import PositionUpdateCounter

    PartialState(cpu=True)
    counter = PositionUpdateCounter(16, processes=world)
    for step in seen[rank]:
        ids = torch.tensor([step], dtype=torch.long)  # one row: these position ids, all real tokens
        counter.add_batch(ids, torch.ones_like(ids))
        counter.end_step()
    own = counter.counts.tolist()
    counter.merge_processes(gather_object)
    return {"own": own, "merged": counter.to_dict()}


def callback_metrics(rank: int, world: int, conll: str) -> dict:
    """What `PositionBiasCallback.on_evaluate` adds to the Trainer's metrics on this rank (the
    Trainer's state says which rank is process zero), and what this rank's model scores alone;
    each rank's model has its own random weights, so equal metrics are the first rank's."""
    from types import SimpleNamespace

    import torch
    from accelerate import PartialState
    from transformers import AutoTokenizer

    from posbias.config import RESOURCES
    from posbias.hf import PositionBiasCallback

    from helpers.hf import bert

    PartialState(cpu=True)
    tok = AutoTokenizer.from_pretrained(str(RESOURCES / "tiny_tokenizer"))
    model = bert(tok, hidden_dropout_prob=0.0)
    with torch.no_grad():  # another model on each rank
        for p in model.classifier.parameters():
            p.add_(0.5 * rank)
    cb = PositionBiasCallback(conll, tok, k_max=3, alphas=(1, 3), quantiles=None)
    state = SimpleNamespace(is_world_process_zero=rank == 0, global_step=1, log_history=[])
    metrics = {"eval_loss": 1.0}
    cb.on_evaluate(SimpleNamespace(bf16=False, fp16=False), state, None, model=model, metrics=metrics)
    return {"metrics": metrics, "own": cb.position_metrics(model)}


def _gloo_threads() -> list[str]:
    """The names of this process's gloo threads (Linux: /proc/self/task/*/comm)."""
    names = []
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm", encoding="utf-8") as f:
                name = f.read().strip()
        except OSError:  # the thread ended while we looked
            continue
        if "gloo" in name:
            names.append(name)
    return sorted(names)


def process_group_lifetime(rank: int, world: int, first: dict, second: dict, cli_config: str) -> dict:
    """Two `posbias.train()` runs in one launched process, then `posbias train` through the CLI's
    `main`: whether the group is still up after each API run, whether the second run trained, and
    the gloo threads left after the CLI command."""
    import torch.distributed as dist

    import posbias
    from posbias import cli
    from posbias.config import build_config

    posbias.train(build_config(first), progress=False)
    after_first = dist.is_initialized()
    second_summary = posbias.train(build_config(second), progress=False)
    after_second = dist.is_initialized()
    threads_before = _gloo_threads()
    code = cli.main(["--quiet", "train", "qa", "-c", cli_config])
    return {"after_first": after_first, "after_second": after_second, "second_steps": second_summary["steps"],
            "cli_code": code, "after_cli": dist.is_initialized(), "threads_before": threads_before,
            "threads_after": _gloo_threads()}


def cli_command(rank: int, world: int, argv: list) -> dict:
    """`posbias ARGV` in this rank's process, as `torchrun -m posbias ARGV` starts each rank (the
    launcher itself is checked once, in tests/qa/test_end_to_end.py), or as a process of its own
    (`run_ranks(..., group=False)`): its exit code and output (`helpers.cli_here`'s, as a dict)."""
    from helpers import cli_here

    done = cli_here(*argv)
    return {"code": done.returncode, "stdout": done.stdout, "stderr": done.stderr}


def nan_loss_on_rank_1(rank: int, world: int, config: dict, step: int) -> dict:
    """`posbias.train(config)` with rank 1's loss made NaN at its `step`-th training pass: what
    each rank raised (its type and message), or None."""
    import posbias
    from posbias import training
    from posbias.config import build_config

    calls = {"n": 0}
    real = training.passes_loss

    def passes_loss(model, passes, targets):
        calls["n"] += 1
        loss = real(model, passes, targets)
        return loss * float("nan") if calls["n"] == step and rank == 1 else loss

    training.passes_loss = passes_loss  # this rank's own process: nothing to put back
    try:
        posbias.train(build_config(config), progress=False)
    except Exception as e:  # noqa: BLE001 - reported to the test
        return {"raised": type(e).__name__, "message": str(e)}
    return {"raised": None, "message": ""}
