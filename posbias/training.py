"""The training loop: explicit, on accelerate (`accelerate launch` / torchrun give multi-process runs).

(The module is `training`, not `train`, so that `posbias.train()` stays the API function.)

One run = read data -> features -> seed-determined batch order -> [perturbations: replace, or
augment = extra summed passes, see `posbias.perturb`] -> model ->
AdamW + linear warm-up/decay -> periodic evaluation (best checkpoint by the task's main metric) ->
resumable checkpoints. The loop knows nothing about QA or tagging: it talks to a *task* (QA in
`posbias.qa.task`, tagging in `posbias.tagging.task`, registered in `posbias.registry.TASKS`), any
object with the `posbias.tasks.Task` protocol.

`train` holds the output folder and records a failure; `_train` runs the stages, which share the
run's state in a `_Run` and where the loop is in a `_Loop`:
    _setup               checks (`_resolve_resume`), accelerator, data -> features, model, optimizer,
                         schedule, resumed state, run_info.json `running` (`_start_output`)
    _train_epoch         one epoch's batch order (data_order/), then per step:
      _train_step          micro-batches with their perturbed passes, forward/backward, optimizer step
      _log_step            train_log.jsonl, progress, trackers (every train.log_every steps)
      _evaluate_and_save   evaluation when due (eval_log.jsonl, best/ + eval/, early stopping),
                           checkpoints/last when due
    _finish              best/ without an eval file, position_updates.json, run_info.json `finished`

Output folder layout:
    config.yaml          the resolved config
    run_info.json        seed, versions, world size, data summary, status, timings
    train_log.jsonl      loss, lr, examples/s, real tokens/s every `train.log_every` steps; "stats": the
                         model's `training_stats()` if it has them (train.debias's learned-mixin gate)
                         (with augment perturbations: the summed loss, tokens of every pass)
    eval_log.jsonl       metrics at every evaluation
    data_order/epoch-E.json   the epoch's batches as example ids (identical across methods for a seed)
    position_updates.json     per position id, the steps in which it got a gradient from any process's
                              batches (and the step count)
    checkpoints/last/    resumable: weights + optimizer/scheduler/RNG state + trainer_state.json
    best/                best main metric (or final weights without an eval file): safetensors + tokenizer
    eval/                the task's prediction files and metrics.json of best/
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from accelerate import Accelerator
from accelerate.utils import gather_object, parse_flag_from_env
from tqdm.auto import tqdm
from transformers import get_linear_schedule_with_warmup

from .analysis.updates import PositionUpdateCounter
from .batching import Prefetch, batch_order, move
from .checkpoint import MODEL_META, check_max_seq_len, save_checkpoint
from .compat import resumable_keys
from .config import RunConfig, load_config, save_config
from . import devices, outputs
from .encoders import WEIGHTS, first_shape_error, weight_shapes
from .errors import ConfigError, TrainingError, failure_message
from .limits import load_json
from .perturb import perturbations_by_mode, training_passes
from .precision import training_precision
from .tasks import get_task
from .train_state import PLAIN, load_state, save_state
from .utils import atomic_write_json, atomic_write_text, interactive, now_iso, recover_dir, replace_dir, set_seed, versions

def _param_groups(model, weight_decay: float):
    # No decay on biases and normalisation weights (1-D tensors), the usual BERT recipe.
    decay = [p for p in model.parameters() if p.requires_grad and p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.ndim < 2]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def _adamw(groups, lr: float):
    """AdamW, fused where the build supports it (on CPU: 40 ms instead of 147 ms per MiniLM step)."""
    try:
        return torch.optim.AdamW(groups, lr=lr, fused=True)
    except (RuntimeError, TypeError, ValueError):
        return torch.optim.AdamW(groups, lr=lr)


def _check_resume(cfg: RunConfig, ckpt: Path) -> None:
    """Refuse to resume from `ckpt` with a config that differs from the checkpoint's in a key that
    may not change on resume (`resumable_keys`: the fields marked `resumable`, e.g. train.epochs);
    anything else would silently make the resumed run a different experiment."""
    old = load_config(ckpt / "posbias.yaml", saved=True).to_dict()
    new = cfg.to_dict()
    resumable = resumable_keys(type(cfg))
    for section in new:
        a, b = old.get(section), new[section]
        if isinstance(b, dict) and isinstance(a, dict):
            # Both sides' keys: `to_dict` leaves out keys at None (`train.debias`), so a key only the
            # checkpoint has was switched off.
            diff = [k for k in (*b, *(k for k in a if k not in b))
                    if f"{section}.{k}" not in resumable and a.get(k) != b.get(k)]
            if diff:
                raise ConfigError(f"cannot resume from {ckpt}: {section}.{diff[0]} changed "
                                  f"({a.get(diff[0])!r} -> {b.get(diff[0])!r})")
        elif a != b:
            raise ConfigError(f"cannot resume from {ckpt}: {section} changed ({a!r} -> {b!r})")


def _check_output_dir(out: Path, key: str) -> None:
    """An output folder that can be created and written, named by its key when it cannot."""
    if out.exists() and not out.is_dir():
        raise ConfigError(f"{key} {out} is an existing file, not a folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / f".posbias-write-test-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise ConfigError(f"{key} {out} cannot be written: {e.strerror or e}") from None


# accelerate's engines that shard the model over processes, by the variable `accelerate launch` sets
# for them (from its flags or its config file's distributed_type).
SHARDED_ENGINES = {"ACCELERATE_USE_FSDP": "FSDP", "ACCELERATE_USE_DEEPSPEED": "DeepSpeed",
                   "ACCELERATE_USE_MEGATRON_LM": "Megatron-LM"}


def refuse_sharded_engines() -> None:
    """Refuse, by name, an accelerate engine that shards the model (FSDP, DeepSpeed): posbias saves
    its checkpoints and evaluates from the whole model on the main process, which under such an
    engine holds only its shard, and the other processes would wait for it in a collective."""
    for var, engine in SHARDED_ENGINES.items():
        if parse_flag_from_env(var):
            raise ConfigError(f"train: {engine} ({var}=true, from accelerate launch or its config's "
                              f"distributed_type) is not supported by posbias training: it saves and evaluates "
                              f"the whole model on the main process; launch plain data-parallel processes "
                              f"(torchrun, or accelerate launch with distributed_type MULTI_GPU)")


class _Schedule:
    """Which global batches each optimizer step consumes on this process."""

    def __init__(self, n_batches: int, world: int, accum: int):
        self.n_batches, self.world, self.accum = n_batches, world, accum
        per_step = world * accum
        # With several processes every one must run the same number of steps (DDP all-reduces), so
        # the last incomplete group of batches is dropped; one process keeps a short last step.
        self.steps_per_epoch = n_batches // per_step if world > 1 else math.ceil(n_batches / accum)
        if self.steps_per_epoch == 0:
            raise ConfigError(f"only {n_batches} batches per epoch: fewer than processes ({world}) x "
                              f"train.grad_accum ({accum}); lower train.batch_size")

    def micro_batches(self, local_step: int, rank: int) -> list[int]:
        base = local_step * self.world * self.accum
        idx = [base + a * self.world + rank for a in range(self.accum)]
        return [i for i in idx if i < self.n_batches]


def _release_accelerator_state(mixed_precision: str) -> None:
    """Under a launcher, let a second run in this process use another precision: accelerate keeps one
    AcceleratorState per process and refuses a new Accelerator with a different `mixed_precision`.
    The precision part is dropped; the process group (PartialState) is kept."""
    from accelerate.state import AcceleratorState

    shared = getattr(AcceleratorState, "_shared_state", None)
    if shared and str(shared.get("_mixed_precision", mixed_precision)) != mixed_precision:
        AcceleratorState._reset_state(reset_partial_state=False)


def _accelerator(spec: str, device, precision, log_with, out: Path, scope: contextlib.ExitStack) -> Accelerator:
    """The run's Accelerator on `device` (`spec`: train.device as written).

    accelerate keeps its state per process (PartialState: the device and the process group), so a
    second `train()` in one process kept the first one's device: CPU after CUDA failed, CUDA after
    the CPU trained on the CPU, and `cuda:N` was GPU 0 (accelerate is only told "CPU or not"). A run
    no launcher started gets a fresh state on its own device (accelerate's ACCELERATE_TORCH_DEVICE,
    set while the Accelerator is made), with torch's current CUDA device set to it until the run
    ends (`scope`). Under torchrun / `accelerate launch` the process group is kept and each process
    takes the GPU of its LOCAL_RANK; an explicit `cuda:N` is refused there (`devices.check_launch`)."""
    from accelerate.state import AcceleratorState

    processes = devices.launched()
    devices.check_launch(spec, processes)
    if processes:
        _release_accelerator_state(precision.accelerate)
        env = {}
    else:
        AcceleratorState._reset_state(reset_partial_state=True)
        env = {"ACCELERATE_TORCH_DEVICE": None if device.type == "cpu" else str(device)}
        scope.enter_context(devices.current(device))
    with devices.environ(env):
        return Accelerator(mixed_precision=precision.accelerate, cpu=device.type == "cpu", log_with=log_with,
                           project_dir=str(out / "tracking") if log_with else None)


class _RunRecord:
    """What a failed run leaves in `run_info.json`: once this attempt owns the run (it wrote
    run_info.json as `running`, or it is resuming the run after the checks), any exception —
    a damaged checkpoint, a full disk, a bug, Ctrl-C — rewrites it as `failed` (`interrupted`),
    with `finished` and the one-line `error`, so that no dead run reads `running`."""

    def __init__(self):
        self.path: Path | None = None  # run_info.json, once this attempt owns the run
        self.info: dict | None = None  # the run_info this attempt wrote, else None (read from the file)
        self.main = os.environ.get("RANK", "0") == "0"  # until accelerate says which process writes

    def fail(self, e: BaseException) -> None:
        """Best effort: a failure to write (the disk is full) never hides `e`, the real error."""
        if self.path is None or not self.main:
            return
        try:
            info = self.info
            if info is None:
                try:
                    info = json.loads(self.path.read_text(encoding="utf-8"))
                except (OSError, ValueError, RecursionError):
                    info = None
                info = info if isinstance(info, dict) else {}
            info.update(status="interrupted" if isinstance(e, KeyboardInterrupt) else "failed", finished=now_iso(),
                        error=failure_message(e))
            atomic_write_json(self.path, info)
        except Exception:  # the original error is what the user must see
            pass


# Every name training writes in train.output_dir: none may be a link (`outputs.no_link`).
WRITTEN = ("best", "best.tmp", "best.old", "eval", "eval.tmp", "eval.old", "checkpoints", "checkpoints/last",
           "checkpoints/last.tmp", "checkpoints/last.old", "data_order", "train_log.jsonl", "eval_log.jsonl",
           "config.yaml", "run_info.json", "position_updates.json")


@dataclass
class _Run:
    """One run's state, built by `_setup` and carried through the stages of `_train`."""

    cfg: RunConfig
    out: Path  # train.output_dir
    last_dir: Path  # checkpoints/last
    progress: bool
    acc: Any  # the Accelerator
    main: bool  # the process that writes (and logs)
    log_with: list[str] | None  # accelerate's trackers (train.report_to)
    task: Any  # a `posbias.tasks.Task`
    tokenizer: Any
    examples: list  # the training examples (after data.max_train_examples)
    feats: Any  # their features
    lengths: Any  # the features' lengths in tokens (feats.lengths, computed once), for the batch order
    eval_ds: Any  # the evaluation data set, or None without data.eval_file
    model: Any  # as `acc.prepare` returned it (wrapped for DDP with several processes)
    raw_model: Any  # the task model itself
    optimizer: Any
    scheduler: Any
    sched: _Schedule
    total_steps: int
    replace: list  # perturbations applied to the batch (mode replace)
    augment: list  # perturbations adding a pass (mode augment)
    updates: PositionUpdateCounter
    state: dict  # the loop's own state, saved as trainer_state.json
    run_info: dict
    started: float  # time.time() at the start, for the summary's wall_seconds


def _new_window() -> dict:
    """Loss and throughput since the last log line. `pending`: (step, loss) of the micro-batches
    whose loss is still on the device, read by `_read_losses` when a log line, an evaluation or a
    checkpoint is due (one device -> host copy there, none per step)."""
    return {"loss": 0.0, "n": 0, "examples": 0, "tokens": 0, "padded": 0, "t0": time.perf_counter(),
            "pending": []}


@dataclass
class _Loop:
    """Where the loop is: the last finished step, the progress bar, the throughput window."""

    step: int
    bar: Any
    lines: bool  # plain progress lines (a log file) instead of the bar
    window: dict  # loss and throughput since the last log line (`_new_window`)
    prefetch: Any = None  # the epoch's collated micro-batches (`batching.Prefetch`), this process's share


def train(cfg: RunConfig, resume: str | None = None, overwrite: bool = False, progress: bool = True,
          data: dict | None = None) -> dict:
    """Train a model for `cfg.task` as `cfg` says; returns a summary (best step, metrics, throughput).

    train.output_dir must be new, empty or posbias's own (`outputs.output_folder`); it has one
    writer at a time: the main process holds its lock for the whole run. A run that fails after it
    started (see `_RunRecord`) ends `failed` in run_info.json, with the error.

    Args:
        resume: a checkpoint folder, or "auto" for `<output_dir>/checkpoints/last` when present.
        overwrite: allow starting afresh in an output folder that already holds a run.
        data: {"train": ..., "eval": ...} in-memory data sets (Hugging Face `datasets`) read instead of
            data.train_file / data.eval_file, which then only name them (`posbias.api.train`).
    """
    out = Path(cfg.train.output_dir)
    _check_output_dir(out, "train.output_dir")
    # Under torchrun / `accelerate launch` every process trains; the first (RANK 0) writes and locks.
    # `scope`: what the run sets for itself (the current CUDA device, deterministic algorithms), put back at its end.
    with outputs.output_folder(out, "train.output_dir", hold=os.environ.get("RANK", "0") in ("0", "")), \
            contextlib.ExitStack() as scope:
        for name in WRITTEN:
            outputs.no_link(out / name, "train.output_dir")
        record = _RunRecord()
        try:
            return _train(cfg, resume, overwrite, progress, data, record, scope)
        except BaseException as e:
            if isinstance(e, OSError) and e.filename is None:  # e.g. a log line on a full disk: name the run
                e = OSError(e.errno, e.strerror or str(e), str(cfg.train.output_dir))
            record.fail(e)
            raise e


def _train(cfg: RunConfig, resume: str | None, overwrite: bool, progress: bool, data: dict | None,
           record: _RunRecord, scope: contextlib.ExitStack) -> dict:
    """The run, stage by stage: set up, train epoch by epoch (evaluating and saving as it goes), finish."""
    run = _setup(cfg, resume, overwrite, progress, data, record, scope)
    run.model.train()
    step = run.state["global_step"]
    window = _new_window()
    bar = tqdm(total=run.total_steps, initial=step, desc="train",
               disable=not progress or not run.main or not interactive(), dynamic_ncols=True)
    lines = progress and run.main and not interactive()  # a log file gets a plain line per log_every steps
    loop = _Loop(step, bar, lines, window)
    while loop.step < run.total_steps and not run.state.get("stopped_early"):  # a resumed early-stopped run is done
        _train_epoch(run, loop)
    bar.close()
    return _finish(run, loop.step)


def _resolve_resume(cfg: RunConfig, resume: str | None, overwrite: bool) -> str | None:
    """The checkpoint to resume from (None: a fresh start), after the checks that come before anything
    is built: the output folder's state, the checkpoint, the config."""
    t, d = cfg.train, cfg.data
    out = Path(t.output_dir)
    last_dir = out / "checkpoints" / "last"
    # A crash between the two renames of a save leaves `last` (or `best`, `eval`) missing beside a
    # complete `.tmp` or `.old` copy: put it back before deciding whether there is a run to resume.
    recover_dir(last_dir, "trainer_state.json")
    recover_dir(out / "best", MODEL_META)
    recover_dir(out / "eval", "metrics.json")
    if resume is not None and resume != "auto":
        recover_dir(Path(resume), "trainer_state.json")
    asked = resume
    if resume == "auto":
        resume = str(last_dir) if (last_dir / "trainer_state.json").is_file() else None
    if resume is None and (last_dir.exists() or (out / "best").exists()) and not overwrite:
        if asked == "auto":
            raise ConfigError(f"--resume: train.output_dir {out} holds a run but no complete checkpoint in "
                              f"{last_dir} to resume from; pass --overwrite to start again")
        raise ConfigError(f"train.output_dir {out} already holds a run: pass --resume to continue it, "
                          "--overwrite to start again, or choose another train.output_dir")
    if resume is not None:
        if not (Path(resume) / "trainer_state.json").is_file():
            raise ConfigError(f"--resume {resume}: not a resumable checkpoint (no trainer_state.json)")
        _check_resume(cfg, Path(resume))
    if d.train_file is None:
        raise ConfigError("data.train_file must be set to train")
    if t.early_stopping_patience and not d.eval_file:
        raise ConfigError("train.early_stopping_patience needs data.eval_file (the metric it watches)")
    return resume


def _setup(cfg: RunConfig, resume: str | None, overwrite: bool, progress: bool, data: dict | None,
           record: _RunRecord, scope: contextlib.ExitStack) -> _Run:
    """Everything before the first step: the checks, the accelerator, data -> features, the model,
    optimizer and schedule, the resumed state, and the output folder made ready (run_info.json
    `running`, from which point `record` owns the run). What the run sets for itself goes on `scope`."""
    t, d = cfg.train, cfg.data
    out = Path(t.output_dir)
    resume = _resolve_resume(cfg, resume, overwrite)
    refuse_sharded_engines()
    if t.num_threads:
        torch.set_num_threads(t.num_threads)

    # Without CUDA, accelerate only joins a torchrun/`accelerate launch` process group when told cpu=True.
    device = devices.resolve_device(t.device)
    log_with = _trackers(t.report_to)
    precision = training_precision(t.mixed_precision, device)  # the option, else accelerate's launch flag/config
    scope.enter_context(devices.deterministic(t.deterministic))
    acc = _accelerator(t.device, device, precision, log_with, out, scope)
    main = record.main = acc.is_main_process
    if resume is not None:
        _check_world_size(Path(resume), acc.num_processes)  # refused before the run is touched
        record.path = out / "run_info.json"  # past the checks, this attempt continues the run: it owns it from here
    if main and progress and (t.mixed_precision != "no" or precision.source == "accelerate"):
        print(f"posbias: training in {precision.name} ({precision.reason})", file=sys.stderr, flush=True)
    set_seed(t.seed)
    started = time.time()

    # ---- data -> features
    task = get_task(cfg.task, "task")
    tokenizer = task.load_tokenizer(cfg)
    data = data or {}
    train_ds = task.read(data["train"] if data.get("train") is not None else d.train_file, cfg)
    examples = train_subset(train_ds.examples, d.max_train_examples, d.train_subset, t.seed)
    feats = task.train_features(examples, tokenizer, cfg, train_ds)
    eval_ds = None
    if d.eval_file:
        eval_ds = task.read(data["eval"] if data.get("eval") is not None else d.eval_file, cfg)
        if d.max_eval_examples:
            eval_ds.examples = eval_ds.examples[: d.max_eval_examples]
    lengths = feats.lengths

    # ---- model, optimizer, schedule
    set_seed(t.seed)  # head initialisation independent of how much data was read
    model = task.build_model(cfg, tokenizer, train_ds, feats)
    check_max_seq_len(model, cfg)  # the same rule evaluation, prediction and diagnosis apply
    replace, augment = perturbations_by_mode(cfg.perturb, cfg)  # see posbias.perturb for the modes
    for p in replace + augment:
        if hasattr(p, "bind"):
            p.bind(model, tokenizer)
    optimizer = _adamw(_param_groups(model, t.weight_decay), t.lr)
    n_batches = len(batch_order(lengths, t.batch_size, t.seed, 0, length_grouping=t.length_grouping,
                                group_batches=t.group_batches))
    sched = _Schedule(n_batches, acc.num_processes, t.grad_accum)
    total_steps = t.max_steps or math.ceil(t.epochs * sched.steps_per_epoch)
    scheduler = get_linear_schedule_with_warmup(optimizer, int(t.warmup_ratio * total_steps), total_steps)
    model, optimizer = acc.prepare(model, optimizer)
    raw_model = acc.unwrap_model(model)

    # ---- resumed state
    state = {"global_step": 0, "best_metric": None, "best_step": None, "train_seconds": 0.0,
             "world_size": acc.num_processes}
    # §2.3 pilot of the Random Padding paper: how often each position embedding gets a gradient.
    updates = PositionUpdateCounter(getattr(raw_model.encoder.config, "max_position_embeddings", None)
                                    or d.max_seq_len, processes=acc.num_processes)
    if resume is not None:
        _load_resume(Path(resume), raw_model, optimizer, scheduler, acc.process_index, state, updates,
                     device=acc.device, scaler=getattr(acc, "scaler", None))

    run_info = {
        "status": "running", "started": now_iso(), "seed": t.seed, "versions": versions(),
        "task": cfg.task, "world_size": acc.num_processes, "config_hash": cfg.hash(), **task.run_info(cfg, train_ds, feats),
        "train_file": train_ds.path, "train_skipped_records": len(train_ds.skipped),
        "train_skipped": train_ds.skipped[:100], "train_features": feats.stats,
        "eval_file": eval_ds.path if eval_ds else None,
        "eval_skipped_records": len(eval_ds.skipped) if eval_ds else 0,
        "steps_per_epoch": sched.steps_per_epoch, "total_steps": total_steps,
        "resumed_from": resume, "resumed_at_step": state["global_step"] if resume else None,
        "hardware": devices.describe(acc.device), "mixed_precision": t.mixed_precision,
        "precision": precision.to_dict(), "deterministic": t.deterministic,
    }
    run = _Run(cfg=cfg, out=out, last_dir=out / "checkpoints" / "last", progress=progress, acc=acc, main=main,
               log_with=log_with, task=task, tokenizer=tokenizer, examples=examples, feats=feats, lengths=lengths,
               eval_ds=eval_ds, model=model, raw_model=raw_model, optimizer=optimizer, scheduler=scheduler,
               sched=sched, total_steps=total_steps, replace=replace, augment=augment, updates=updates,
               state=state, run_info=run_info, started=started)
    _start_output(run, resume, record)
    return run


def _start_output(run: _Run, resume: str | None, record: _RunRecord) -> None:
    """Make the output folder ready (main process): a fresh start removes what an earlier run left,
    a resumed one drops the log lines of the steps it will run again; then config.yaml and
    run_info.json (`running`), and the trackers."""
    out = run.out
    if run.main:
        out.mkdir(parents=True, exist_ok=True)
        if resume is None:  # a fresh start (--overwrite): nothing of an earlier run may survive
            for stale in ("train_log.jsonl", "eval_log.jsonl"):
                (out / stale).unlink(missing_ok=True)
            for stale in ("best", "eval", "checkpoints", "data_order", "eval.tmp", "best.tmp"):
                outputs.remove_dir(out / stale, "train.output_dir")
        else:  # steps after the checkpoint will run again: drop their log lines
            for log in ("train_log.jsonl", "eval_log.jsonl"):
                _truncate_log(out / log, run.state["global_step"])
        save_config(run.cfg, out / "config.yaml")
        record.path, record.info = out / "run_info.json", run.run_info
        atomic_write_json(out / "run_info.json", run.run_info)
    if run.log_with:
        run.acc.init_trackers(out.name or "posbias", config=_flat_config(run.cfg.to_dict()))


def _train_epoch(run: _Run, loop: _Loop) -> None:
    """The steps of the epoch `loop.step` is in, from there to the epoch's end (or the run's end, or
    early stopping): its batch order (written to data_order/ by the main process), then step by step
    training, logging, evaluating and saving."""
    t = run.cfg.train
    epoch = loop.step // run.sched.steps_per_epoch
    batches = batch_order(run.lengths, t.batch_size, t.seed, epoch,
                          length_grouping=t.length_grouping, group_batches=t.group_batches)
    if run.main:
        ids = [[run.examples[run.feats.example_index[w]].id for w in b] for b in batches]
        atomic_write_json(run.out / "data_order" / f"epoch-{epoch}.json",
                          {"seed": t.seed, "epoch": epoch, "batches": ids,
                           "windows": [b.tolist() for b in batches]}, indent=None)
    # This process's micro-batches for the rest of the epoch, collated off the main thread.
    end = min(run.total_steps, (epoch + 1) * run.sched.steps_per_epoch)
    keys = [bi for s in range(loop.step, end)
            for bi in run.sched.micro_batches(s % run.sched.steps_per_epoch, run.acc.process_index)]

    def collate(bi: int) -> dict:
        return run.task.collate(run.feats, batches[bi], run.tokenizer, with_labels=True)

    ahead = collate_ahead(run.acc.device)
    with Prefetch(collate, keys, pin_memory=run.acc.device.type == "cuda", thread=ahead) as loop.prefetch:
        while loop.step < run.total_steps and loop.step // run.sched.steps_per_epoch == epoch:
            try:
                _train_step(run, loop, batches)
            except Exception:
                # Steps after a non-finite loss train on damaged weights until the next read: a
                # failure there (an op that refuses NaN) is the divergence's, reported as such.
                _raise_if_diverged(run, loop)
                raise
            if loop.step % t.log_every == 0 or loop.step == run.total_steps:
                _log_step(run, loop)
            _evaluate_and_save(run, loop)
            if run.state.get("stopped_early"):  # the main metric stopped improving: best/ holds the best
                return


def collate_ahead(device) -> bool:
    """Whether the next batches are collated on a background thread (and pinned): on CUDA, where it
    overlaps the GPU's work. On a CPU there is nothing to overlap, the thread cost system time
    (BENCHMARKS, "Host synchronisations"), and a gloo run once hung at exit with it: inline there."""
    return device.type == "cuda"


def _train_step(run: _Run, loop: _Loop, batches: list) -> None:
    """One optimizer step: its micro-batches (this process's share of `batches`, the epoch's order,
    collated by `loop.prefetch`), each with its perturbed passes, forward and backward. The losses
    stay on the device until `_read_losses` (at the next log line, evaluation or checkpoint), which
    stops the run on a non-finite one before anything of its step is saved."""
    t, acc, window = run.cfg.train, run.acc, loop.window
    step = loop.step
    t_step = time.perf_counter()
    micro = run.sched.micro_batches(step % run.sched.steps_per_epoch, acc.process_index)
    epoch = step // run.sched.steps_per_epoch
    for j, bi in enumerate(micro):
        batch = loop.prefetch.get(bi)
        # The replace-perturbed batch, then one perturbed copy per augment perturbation; the draws
        # are the global batch's own, whichever process trains it.
        gen = batch_generator(t.seed, epoch, bi)
        passes = training_passes(batch, run.replace, run.augment, gen)
        for b in passes:  # counted on the host's copy: no device -> host copy per step
            run.updates.add_model_batch(run.raw_model, b)  # the ids the encoder is given (DyReF: queries, +2)
            window["tokens"] += int(b["attention_mask"].sum())
            window["padded"] += b["input_ids"].numel()
        passes = [move(b, acc.device) for b in passes]
        sync = j == len(micro) - 1
        ctx = acc.no_sync(run.model) if not sync else contextlib.nullcontext()
        with ctx:
            loss = passes_loss(run.model, passes, run.task.targets)
            acc.backward(loss / len(micro))
        # Read at the next log line, evaluation or checkpoint (`_read_losses`), not here: `.item()`
        # per micro-batch would make the GPU wait on Python every step.
        window["pending"].append((step + 1, loss.detach()))
        window["examples"] += len(batches[bi])
    if t.max_grad_norm:
        acc.clip_grad_norm_(run.model.parameters(), t.max_grad_norm)
    run.optimizer.step()
    run.scheduler.step()
    run.updates.end_step()
    run.optimizer.zero_grad(set_to_none=True)
    loop.step = step + 1
    run.state["train_seconds"] += time.perf_counter() - t_step
    loop.bar.update(1)


def _log_step(run: _Run, loop: _Loop) -> None:
    """A train_log.jsonl line (main process), the progress bar or line, the trackers; then a new window."""
    _read_losses(run, loop)
    acc, window, step = run.acc, loop.window, loop.step
    dt = time.perf_counter() - window["t0"]
    rec = {"step": step, "epoch": round(step / run.sched.steps_per_epoch, 4),
           "loss": window["loss"] / max(window["n"], 1), "lr": run.scheduler.get_last_lr()[0],
           "examples_per_s": window["examples"] * acc.num_processes / dt,
           "tokens_per_s": window["tokens"] * acc.num_processes / dt,
           "padding_fraction": 1 - window["tokens"] / max(window["padded"], 1)}
    # A model's own training scalars (e.g. the learned-mixin gate), over this process's batches.
    stats = getattr(run.raw_model, "training_stats", lambda: {})()
    if stats:
        rec["stats"] = stats
    loop.bar.set_postfix(loss=f"{rec['loss']:.3f}", ex_s=f"{rec['examples_per_s']:.1f}",
                         tok_s=f"{rec['tokens_per_s']:.0f}")
    if loop.lines:
        print(f"train step {step}/{run.total_steps}  loss {rec['loss']:.4f}  lr {rec['lr']:.3g}  "
              f"{rec['examples_per_s']:.1f} ex/s  {rec['tokens_per_s']:.0f} tok/s", file=sys.stderr, flush=True)
    if run.main:
        with open(run.out / "train_log.jsonl", "a", encoding="utf-8") as f:
            f.write(json.dumps(rec) + "\n")
    if run.log_with:
        acc.log({f"train/{k}": v for k, v in {**rec, **stats}.items() if k not in ("step", "stats")},
                step=step)
    loop.window = _new_window()


def _evaluate_and_save(run: _Run, loop: _Loop) -> None:
    """After a step: evaluate when due (eval_log.jsonl, best/ and eval/ on an improvement, early
    stopping's count), save the resumable checkpoints/last when due. Not counted as training time."""
    t, state, step, out = run.cfg.train, run.state, loop.step, run.out
    pause = time.perf_counter()  # evaluation and saving do not count towards throughput
    end_of_epoch = step % run.sched.steps_per_epoch == 0
    do_eval = run.eval_ds is not None and (
        step == run.total_steps or (t.eval_every and step % t.eval_every == 0)
        or (not t.eval_every and end_of_epoch))
    do_save = do_eval or step == run.total_steps or (t.save_every and step % t.save_every == 0)
    if do_eval or do_save:
        _read_losses(run, loop)  # nothing of a step with a non-finite loss is evaluated or saved
    if do_eval:
        result = run.task.evaluate(run.model, run.tokenizer, run.cfg, run.eval_ds, out / "eval.tmp",
                                   accelerator=run.acc, progress=run.progress)
        metric_name, metric = run.task.main_metric(result)
        state["metric_name"] = metric_name
        if run.main:
            with open(out / "eval_log.jsonl", "a", encoding="utf-8") as f:
                f.write(json.dumps({"step": step, **result}) + "\n")
        if run.log_with:
            run.acc.log({f"eval/{k}": v for k, v in result.items() if isinstance(v, (int, float))
                         and not isinstance(v, bool)}, step=step)
        improved = state["best_metric"] is None or metric > state["best_metric"]
        state["evals_without_improvement"] = 0 if improved else state.get("evals_without_improvement", 0) + 1
        if t.early_stopping_patience and state["evals_without_improvement"] >= t.early_stopping_patience:
            state["stopped_early"] = step
        better = improved or not t.save_best
        if better:
            state["best_metric"], state["best_step"] = metric, step
            if run.main:
                _save_best(run.raw_model, run.cfg, run.tokenizer, out, step, result)
        elif run.main:
            outputs.remove_dir(out / "eval.tmp", "train.output_dir")
        run.model.train()
    if do_save:
        state["global_step"] = step
        run.updates.merge_processes(gather_object)  # every process's batches (a collective)
        state["position_updates"] = run.updates.to_dict()
        _save_last(run.acc, run.raw_model, run.optimizer, run.scheduler, run.cfg, run.tokenizer, state,
                   run.last_dir, gather_object)
    loop.window["t0"] += time.perf_counter() - pause


def _finish(run: _Run, step: int) -> dict:
    """The end of a run that trained to its last step (or stopped early): best/ from the final
    weights when there is no evaluation, position_updates.json, run_info.json `finished` with the
    summary, which is returned."""
    out, state = run.out, run.state
    if run.eval_ds is None and run.main:
        _save_best(run.raw_model, run.cfg, run.tokenizer, out, step, None)
        state["best_step"] = step
    run.acc.wait_for_everyone()
    run.updates.merge_processes(gather_object)  # every process's batches (a collective)
    summary = {"output_dir": str(out), "steps": step, "best_step": state["best_step"],
               "best_metric": state["best_metric"], "metric": state.get("metric_name"),
               f"best_{state.get('metric_name') or 'metric'}": state["best_metric"],
               "train_seconds": round(state["train_seconds"], 2),
               "wall_seconds": round(time.time() - run.started, 2)}
    if state.get("stopped_early"):
        summary["stopped_early_at"] = state["stopped_early"]
    if run.eval_ds is not None and (out / "eval" / "metrics.json").is_file():
        summary["eval"] = json.loads((out / "eval" / "metrics.json").read_text(encoding="utf-8"))
    if run.main:
        atomic_write_json(out / "position_updates.json", run.updates.to_dict(), indent=None)
        run.run_info.update(status="finished", finished=now_iso(), summary=summary)
        atomic_write_json(out / "run_info.json", run.run_info)
    for tracker in run.acc.trackers:  # accelerate's end_training, less its destroy_process_group: under a
        tracker.finish()  # launcher the group is the caller's (the CLI ends it: devices.end_launch)
    return summary


def _trackers(names: list[str]) -> list[str] | None:
    """accelerate's `log_with` for `train.report_to`; a tracker whose package is missing is an error
    (accelerate would drop it without a word)."""
    if not names:
        return None
    from accelerate.tracking import get_available_trackers

    available = {getattr(x, "value", str(x)) for x in get_available_trackers()}
    for name in names:
        if name != "all" and name not in available:
            extra = " (or the posbias[track] extra)" if name == "tensorboard" else ""
            raise ConfigError(f"train.report_to: the {name} tracker is not installed: pip install {name}{extra}")
    return list(names)


def _flat_config(d: dict, prefix: str = "") -> dict:
    """The run config as flat scalar hyper-parameters (trackers such as TensorBoard take no nesting)."""
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flat_config(v, key + "."))
        elif isinstance(v, (int, float, str, bool)):
            out[key] = v
        else:
            out[key] = json.dumps(v)
    return out


def _read_losses(run: _Run, loop: _Loop) -> None:
    """Add the losses still on the device (`window["pending"]`) to the window, in one device ->
    host copy, and stop the run when one of them, on any process, is NaN/inf: named by the first
    such step, whose update (and the steps' after it) is in the weights but in nothing saved, since
    every log line, evaluation and checkpoint reads first. All processes read at the same steps."""
    window = loop.window
    pending, window["pending"] = window["pending"], []
    values = torch.stack([loss.float() for _, loss in pending]).tolist() if pending else []
    first = None  # (step, value) of the first non-finite loss of this process
    for (step, _), value in zip(pending, values):  # the same float64 sum, in the same order, as before
        if first is None and not math.isfinite(value):
            first = (step, value)
        window["loss"] += value
        window["n"] += 1
    bad_step = first[0] if first else None
    if run.acc.num_processes > 1:  # the earliest non-finite step over the processes
        flag = torch.tensor(bad_step if first else run.total_steps + 1, device=run.acc.device)
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MIN)
        bad_step = int(flag) if int(flag) <= run.total_steps else None
    if bad_step is not None:
        _diverged(run.out, bad_step, first[1] if first and first[0] == bad_step else None, run.last_dir)


def _raise_if_diverged(run: _Run, loop: _Loop) -> None:
    """This process's pending losses read after a failed step: the divergence error when one is
    not finite (no collective: the other processes are not at this point)."""
    try:
        pending = loop.window["pending"]
        values = torch.stack([loss.float() for _, loss in pending]).tolist() if pending else []
    except Exception:  # the device itself failed: the original error says more
        return
    for (step, _), value in zip(pending, values):
        if not math.isfinite(value):
            _diverged(run.out, step, value, run.last_dir)


def _diverged(out: Path, step: int, value, last_dir: Path) -> None:
    """Stop a run whose loss became NaN/inf at `step`, naming the last good checkpoint (`train`
    records the error in run_info.json, as for any failure)."""
    try:
        done = _read_trainer_state(last_dir / "trainer_state.json")["global_step"]
        where = f"the last good checkpoint is {last_dir} (step {done})"
    except (ConfigError, OSError):
        where = "no checkpoint was saved before it"
    what = f"the training loss is {value}" if value is not None else "the training loss of another process is not finite"
    raise TrainingError(f"{out}: {what} at step {step}; stopped, nothing of that step or after was saved, "
                        f"{where}. "
                        "Lower train.lr, set train.max_grad_norm, or check the data")


# trainer_state.json: the loop's own state, each key with the types it may hold.
_TRAINER_STATE = {"global_step": (int,), "best_metric": (int, float, type(None)), "best_step": (int, type(None)),
                  "train_seconds": (int, float), "metric_name": (str, type(None)),
                  "evals_without_improvement": (int,), "stopped_early": (int, type(None)),
                  "position_updates": (dict, type(None)), "world_size": (int,)}


def _read_trainer_state(file: Path) -> dict:
    """A checkpoint's trainer_state.json, checked key by key: a damaged one is an error naming it."""
    state = load_json(file, "trainer state")  # bounded: size, nesting, valid UTF-8 JSON
    if not isinstance(state, dict):
        raise ConfigError(f"{file}: not a posbias trainer state (a JSON object); the checkpoint is damaged")
    for key, types in _TRAINER_STATE.items():
        value = state.get(key)
        if key not in state and key != "global_step":
            continue
        if not isinstance(value, types) or isinstance(value, bool) or (key != "best_metric" and
                                                                        isinstance(value, (int, float)) and value < 0):
            raise ConfigError(f"{file}: {key} is {value!r:.60}, not a valid value; the checkpoint is damaged")
    return state


def _load_resume(ckpt: Path, raw_model, optimizer, scheduler, rank: int, state: dict, updates,
                 device=None, scaler=None) -> None:
    """Continue from checkpoint `ckpt`: its weights, optimizer, scheduler and RNG states (the CPU's,
    and this process's CUDA generator when it trains on one), the fp16 loss scaler and the loop's
    state. Every file is checked before it is used: a damaged or foreign one is a ConfigError naming
    it, not an error deep inside torch."""
    from safetensors.torch import load_file

    trainer = _read_trainer_state(ckpt / "trainer_state.json")
    file = ckpt / WEIGHTS
    wrong = first_shape_error({k: tuple(v.shape) for k, v in raw_model.state_dict().items()}, weight_shapes(file),
                              file, "the run's config")
    if wrong:
        raise ConfigError(f"cannot resume: {wrong}")
    raw_model.load_state_dict(load_file(str(file)))
    extra = load_state(ckpt)  # safetensors + JSON: loading a shared checkpoint runs no code
    try:
        optimizer.load_state_dict(extra["optimizer"])
        scheduler.load_state_dict(extra["scheduler"])
        rng = extra["rng"][rank]
        random.setstate(rng["python"])
        np.random.set_state(rng["numpy"])
        torch.set_rng_state(rng["torch"])
        # Dropout on a GPU draws from the device's generator: without its state a resumed run
        # repeats the masks seeded at the start (a checkpoint saved on the CPU has none to restore).
        if device is not None and device.type == "cuda" and "cuda" in rng:
            torch.cuda.set_rng_state(rng["cuda"], device)
        if scaler is not None and extra.get("scaler"):
            scaler.load_state_dict(extra["scaler"])
    except (KeyError, IndexError, TypeError, ValueError, RuntimeError) as e:
        raise ConfigError(f"{ckpt / PLAIN}: does not fit this run ({type(e).__name__}: "
                          f"{' '.join(str(e).split())[:160]}); the checkpoint is damaged or from another "
                          "model") from None
    state.update(trainer)
    if state.get("position_updates"):
        try:
            updates.counts[:] = state["position_updates"]["counts"]
            updates.steps = int(state["position_updates"]["steps"])
        except (KeyError, TypeError, ValueError) as e:
            raise ConfigError(f"{ckpt / 'trainer_state.json'}: position_updates is damaged "
                              f"({type(e).__name__}: {' '.join(str(e).split())[:120]})") from None


def batch_generator(seed: int, epoch: int, batch: int) -> torch.Generator:
    """The generator the perturbations of global batch `batch` (its index in the epoch's order) of
    `epoch` draw from: keyed on the batch, not on the step or the process, so that one process and N
    (and any gradient accumulation) perturb the same batch the same way, and a resumed run draws
    what the uninterrupted one drew."""
    key = np.random.SeedSequence([seed, epoch, batch]).generate_state(2, np.uint32)
    return torch.Generator().manual_seed(int(key[0]) << 32 | int(key[1]))


def _check_world_size(ckpt: Path, world: int) -> None:
    """Refuse to resume checkpoint `ckpt` with `world` processes when another number saved it: the
    batches each step takes, the schedule's length and the per-process random states depend on it.
    Checkpoints from before trainer_state.json had `world_size` tell it by their per-process random
    states."""
    try:
        saved = _read_trainer_state(ckpt / "trainer_state.json").get("world_size")
    except Exception:  # a damaged trainer_state.json: _load_resume names it, with the run owned
        return
    if saved is None:
        rng = load_state(ckpt).get("rng")
        saved = len(rng) if isinstance(rng, list) else world  # a damaged state is _load_resume's to name
    if saved != world:
        raise ConfigError(f"cannot resume from {ckpt}: it was saved by {saved} process{'es' if saved != 1 else ''} "
                          f"and this run has {world}; resume with {saved} (the batch order, the learning-rate "
                          "schedule and each process's random state depend on it)")


def passes_loss(model, passes: list[dict], targets) -> torch.Tensor:
    """The micro-batch's loss: the sum of the model's losses over its passes (one pass without
    augment perturbations; with them, L(batch) + L(p(batch)) for each, the authors' summed step).
    `targets(batch)` gives the label tensors of a pass."""
    losses = [model(b, targets(b))["loss"] for b in passes]
    return torch.stack(losses).sum() if len(losses) > 1 else losses[0]


def _truncate_log(path: Path, last_step: int) -> None:
    """Keep the log lines of steps up to `last_step` (a crash may also have cut the last line short)."""
    if not path.is_file():
        return
    keep = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            if json.loads(line)["step"] <= last_step:
                keep.append(line + "\n")
        except (json.JSONDecodeError, KeyError, TypeError):
            continue
    atomic_write_text(path, "".join(keep))


def _save_best(raw_model, cfg, tokenizer, out: Path, step: int, result: dict | None) -> None:
    tmp = outputs.fresh_dir(out / "best.tmp", "train.output_dir")
    save_checkpoint(raw_model, cfg, tokenizer, tmp, extra={"step": step, "metrics": result})
    replace_dir(tmp, out / "best")
    if result is not None:
        replace_dir(out / "eval.tmp", out / "eval")


def _save_last(acc, raw_model, optimizer, scheduler, cfg, tokenizer, state, last_dir: Path, gather_object) -> None:
    rng = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if acc.device.type == "cuda":
        rng["cuda"] = torch.cuda.get_rng_state(acc.device)
    rngs = gather_object([rng])  # one entry per process, in rank order
    if acc.is_main_process:
        tmp = outputs.fresh_dir(last_dir.with_name("last.tmp"), "train.output_dir")
        save_checkpoint(raw_model, cfg, tokenizer, tmp, extra={"step": state["global_step"]})
        scaler = getattr(acc, "scaler", None)  # fp16 only: the loss scale and its growth tracker
        save_state({"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(), "rng": rngs,
                    **({"scaler": scaler.state_dict()} if scaler is not None else {})}, tmp)
        # trainer_state.json last: its presence marks a complete checkpoint.
        atomic_write_json(tmp / "trainer_state.json", state)
        replace_dir(tmp, last_dir)
    acc.wait_for_everyone()


def train_subset(examples: list, n: int | None, how: str, seed: int) -> list:
    """`data.max_train_examples` of `examples`: the first n, or n drawn with `seed` (kept in file order)."""
    if not n or n >= len(examples):
        return examples
    if how == "random":
        return [examples[i] for i in sorted(random.Random(seed).sample(range(len(examples)), n))]
    return examples[:n]
