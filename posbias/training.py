"""The training loop: explicit, on accelerate (`accelerate launch` / torchrun give multi-process runs).

(The module is `training`, not `train`, so that `posbias.train()` stays the API function.)

One run = read data -> features -> seed-determined batch order -> [perturbations: replace, or
augment = extra summed passes, see `posbias.perturb`] -> model ->
AdamW + linear warm-up/decay -> periodic evaluation (best checkpoint by the task's main metric) ->
resumable checkpoints. The loop knows nothing about QA or tagging: it talks to a *task* (QA in
`posbias.qa.task`, tagging in `posbias.tagging.task`, registered in `posbias.registry.TASKS`), any
object with the `posbias.tasks.Task` protocol.

`train` holds the output folder, records a failure and turns SIGTERM / SIGINT into an interruption
(`posbias.interrupt`); `_train` runs the stages, which share the run's state in a `_Run` and where the
loop is in a `_Loop`:
    _setup               checks (`train_state.resolve_resume`), accelerator, data -> features, model,
                         optimizer, schedule, resumed state, run_info.json `running` (`train_log.start_output`)
    _train_epoch         one epoch's batch order (data_order/), then per step:
      _train_step          micro-batches with their perturbed passes, forward/backward, optimizer step
      train_log.log_step   train_log.jsonl, progress, trackers (every train.log_every steps)
      _evaluate_and_save   evaluation when due (eval_log.jsonl, best/ + eval/, early stopping),
                           checkpoints/last when due
      _stop_if_signalled   after a SIGTERM / SIGINT: checkpoints/last, then run_info.json `interrupted`
    _finish              best/ without an eval file, position_updates.json, run_info.json `finished`

Beside this module: `posbias.optim` (AdamW, its parameter groups, the batches of each step),
`posbias.train_state` (resuming: the checks, checkpoints/last and best/ saved and loaded) and
`posbias.train_log` (the output folder's records, log lines, trackers, the divergence check).

Output folder layout:
    config.yaml          the resolved config
    run_info.json        seed, versions, world size, data summary, status, timings; the position rows
                         model.reinit_positions_from re-initialised (ids, init, seed)
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

from . import devices, outputs
from .analysis.updates import PositionUpdateCounter
from .batching import Prefetch, batch_order, move
from .checkpoint import check_max_seq_len
from .config import RunConfig
from .encoders import reinit_positions
from .errors import ConfigError
from .interrupt import Stop, stop_on_signals
from .optim import StepSchedule, adamw, param_groups
from .perturb import perturbations_by_mode, training_passes
from .precision import training_precision
from .tasks import get_task
from .train_log import (WRITTEN, RunRecord, check_output_dir, log_step, new_window, raise_if_diverged, read_losses,
                        start_output, tracker_names)
from .train_state import check_world_size, load_resume, resolve_resume, save_best, save_last
from .utils import atomic_write_json, interactive, now_iso, set_seed, versions

# Names tests import from this module, as they were before the checkpoint code moved to train_state.
from .encoders import WEIGHTS  # noqa: F401
from .train_state import (check_resume as _check_resume, check_world_size as _check_world_size,  # noqa: F401
                          load_resume as _load_resume, read_trainer_state as _read_trainer_state,
                          save_last as _save_last)


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
    sched: StepSchedule
    total_steps: int
    replace: list  # perturbations applied to the batch (mode replace)
    augment: list  # perturbations adding a pass (mode augment)
    updates: PositionUpdateCounter
    state: dict  # the loop's own state, saved as trainer_state.json
    run_info: dict
    started: float  # time.time() at the start, for the summary's wall_seconds


@dataclass
class _Loop:
    """Where the loop is: the last finished step, the progress bar, the throughput window."""

    step: int
    bar: Any
    lines: bool  # plain progress lines (a log file) instead of the bar
    window: dict  # loss and throughput since the last log line (`new_window`)
    stop: Stop  # whether a SIGTERM / SIGINT came (`posbias.interrupt`)
    prefetch: Any = None  # the epoch's collated micro-batches (`batching.Prefetch`), this process's share


def train(cfg: RunConfig, resume: str | None = None, overwrite: bool = False, progress: bool = True,
          data: dict | None = None) -> dict:
    """Train a model for `cfg.task` as `cfg` says; returns a summary (best step, metrics, throughput).

    train.output_dir must be new, empty or posbias's own (`outputs.output_folder`); it has one
    writer at a time: the main process holds its lock for the whole run. A run that fails after it
    started (see `RunRecord`) ends `failed` in run_info.json, with the error.

    SIGTERM or SIGINT (`posbias.interrupt`, handlers installed for the run only) ends the run after
    the optimizer step in progress and its evaluation, when one is due: checkpoints/last is saved
    (the steps since the last checkpoint are not lost; `resume="auto"` continues from it),
    run_info.json says `interrupted`, and `interrupt.Interrupted` (a KeyboardInterrupt; the CLI exits
    143 or 130) is raised. A second signal, or one during the setup, raises at once. With several
    processes each one stops at once (no checkpoint: the processes would have to agree on a step, a
    collective per step); the last scheduled checkpoint (train.save_every, evaluations) is where the
    run resumes.

    Args:
        resume: a checkpoint folder, or "auto" for `<output_dir>/checkpoints/last` when present.
        overwrite: allow starting afresh in an output folder that already holds a run.
        data: {"train": ..., "eval": ...} in-memory data sets (Hugging Face `datasets`) read instead of
            data.train_file / data.eval_file, which then only name them (`posbias.api.train`).
    """
    out = Path(cfg.train.output_dir)
    check_output_dir(out, "train.output_dir")
    # Under torchrun / `accelerate launch` every process trains; the first (RANK 0) writes and locks.
    # `scope`: what the run sets for itself (the current CUDA device, deterministic algorithms), put back at its end.
    with outputs.output_folder(out, "train.output_dir", hold=os.environ.get("RANK", "0") in ("0", "")), \
            contextlib.ExitStack() as scope:
        stop = scope.enter_context(stop_on_signals())
        for name in WRITTEN:
            outputs.no_link(out / name, "train.output_dir")
        record = RunRecord()
        try:
            return _train(cfg, resume, overwrite, progress, data, record, scope, stop)
        except BaseException as e:
            if isinstance(e, OSError) and e.filename is None:  # e.g. a log line on a full disk: name the run
                e = OSError(e.errno, e.strerror or str(e), str(cfg.train.output_dir))
            record.fail(e)
            raise e


def _train(cfg: RunConfig, resume: str | None, overwrite: bool, progress: bool, data: dict | None,
           record: RunRecord, scope: contextlib.ExitStack, stop: Stop) -> dict:
    """The run, stage by stage: set up, train epoch by epoch (evaluating and saving as it goes), finish.
    During the epochs a signal waits for the end of its step (`stop.deferred`; one process only)."""
    run = _setup(cfg, resume, overwrite, progress, data, record, scope)
    run.model.train()
    step = run.state["global_step"]
    window = new_window()
    bar = tqdm(total=run.total_steps, initial=step, desc="train",
               disable=not progress or not run.main or not interactive(), dynamic_ncols=True)
    lines = progress and run.main and not interactive()  # a log file gets a plain line per log_every steps
    loop = _Loop(step, bar, lines, window, stop)
    with stop.deferred(run.acc.num_processes == 1):
        while loop.step < run.total_steps and not run.state.get("stopped_early"):  # a resumed early-stopped run is done
            _train_epoch(run, loop)
    bar.close()
    return _finish(run, loop.step)


def _setup(cfg: RunConfig, resume: str | None, overwrite: bool, progress: bool, data: dict | None,
           record: RunRecord, scope: contextlib.ExitStack) -> _Run:
    """Everything before the first step: the checks, the accelerator, data -> features, the model,
    optimizer and schedule, the resumed state, and the output folder made ready (run_info.json
    `running`, from which point `record` owns the run). What the run sets for itself goes on `scope`."""
    t, d = cfg.train, cfg.data
    out = Path(t.output_dir)
    resume = resolve_resume(cfg, resume, overwrite)
    refuse_sharded_engines()
    if t.num_threads:
        torch.set_num_threads(t.num_threads)

    # Without CUDA, accelerate only joins a torchrun/`accelerate launch` process group when told cpu=True.
    device = devices.resolve_device(t.device)
    log_with = tracker_names(t.report_to)
    precision = training_precision(t.mixed_precision, device)  # the option, else accelerate's launch flag/config
    scope.enter_context(devices.deterministic(t.deterministic))
    acc = _accelerator(t.device, device, precision, log_with, out, scope)
    main = record.main = acc.is_main_process
    if resume is not None:
        check_world_size(Path(resume), acc.num_processes)  # refused before the run is touched
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
    # The positive control (model.reinit_positions_from): rear position rows drawn anew, from their own
    # generator. A resumed run's checkpoint then replaces every weight (load_resume, strict), so it
    # continues from the re-initialised and trained rows exactly as the uninterrupted run.
    reinit = reinit_positions(model.encoder, cfg.model.reinit_positions_from, t.seed)
    check_max_seq_len(model, cfg)  # the same rule evaluation, prediction and diagnosis apply
    replace, augment = perturbations_by_mode(cfg.perturb, cfg)  # see posbias.perturb for the modes
    for p in replace + augment:
        if hasattr(p, "bind"):
            p.bind(model, tokenizer)
    optimizer = adamw(param_groups(model, t.weight_decay), t.lr)
    n_batches = len(batch_order(lengths, t.batch_size, t.seed, 0, length_grouping=t.length_grouping,
                                group_batches=t.group_batches))
    sched = StepSchedule(n_batches, acc.num_processes, t.grad_accum)
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
        load_resume(Path(resume), raw_model, optimizer, scheduler, acc.process_index, state, updates,
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
        **({"reinit_positions": reinit} if reinit else {}),
    }
    run = _Run(cfg=cfg, out=out, last_dir=out / "checkpoints" / "last", progress=progress, acc=acc, main=main,
               log_with=log_with, task=task, tokenizer=tokenizer, examples=examples, feats=feats, lengths=lengths,
               eval_ds=eval_ds, model=model, raw_model=raw_model, optimizer=optimizer, scheduler=scheduler,
               sched=sched, total_steps=total_steps, replace=replace, augment=augment, updates=updates,
               state=state, run_info=run_info, started=started)
    start_output(run, resume, record)
    return run


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
                raise_if_diverged(run, loop)
                raise
            if loop.step % t.log_every == 0 or loop.step == run.total_steps:
                log_step(run, loop)
            _evaluate_and_save(run, loop)
            _stop_if_signalled(run, loop)
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
    stay on the device until `read_losses` (at the next log line, evaluation or checkpoint), which
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
        # Read at the next log line, evaluation or checkpoint (`read_losses`), not here: `.item()`
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
        read_losses(run, loop)  # nothing of a step with a non-finite loss is evaluated or saved
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
                save_best(run.raw_model, run.cfg, run.tokenizer, out, step, result)
        elif run.main:
            outputs.remove_dir(out / "eval.tmp", "train.output_dir")
        run.model.train()
    if do_save:
        _save_checkpoint(run, step)
    loop.window["t0"] += time.perf_counter() - pause


def _save_checkpoint(run: _Run, step: int) -> None:
    """checkpoints/last at `step` (every process: the position updates are gathered)."""
    run.state["global_step"] = step
    run.updates.merge_processes(gather_object)  # every process's batches (a collective)
    run.state["position_updates"] = run.updates.to_dict()
    save_last(run.acc, run.raw_model, run.optimizer, run.scheduler, run.cfg, run.tokenizer, run.state,
               run.last_dir, gather_object)


def _stop_if_signalled(run: _Run, loop: _Loop) -> None:
    """After a step (and its evaluation and checkpoint when due): when a SIGTERM / SIGINT came, save
    checkpoints/last unless it holds this step already, then raise `Interrupted` (`train` records the
    run `interrupted`). Always saved, whatever train.save_every says: the steps since the last
    checkpoint are work a resumed run would otherwise redo, and the save replaces checkpoints/last
    whole (through last.tmp), so a SIGKILL during it leaves the previous one."""
    if not loop.stop.requested:
        return
    if run.state["global_step"] != loop.step:  # steps since the last checkpoint
        read_losses(run, loop)  # nothing of a step with a non-finite loss is saved
        _save_checkpoint(run, loop.step)
    if run.main:
        print(f"posbias: {loop.stop.name}: the run stopped at step {loop.step}/{run.total_steps}, resumable from "
              f"{run.last_dir}", file=sys.stderr, flush=True)
    loop.stop.raise_if_requested()


def _finish(run: _Run, step: int) -> dict:
    """The end of a run that trained to its last step (or stopped early): best/ from the final
    weights when there is no evaluation, position_updates.json, run_info.json `finished` with the
    summary, which is returned."""
    out, state = run.out, run.state
    if run.eval_ds is None and run.main:
        save_best(run.raw_model, run.cfg, run.tokenizer, out, step, None)
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


def batch_generator(seed: int, epoch: int, batch: int) -> torch.Generator:
    """The generator the perturbations of global batch `batch` (its index in the epoch's order) of
    `epoch` draw from: keyed on the batch, not on the step or the process, so that one process and N
    (and any gradient accumulation) perturb the same batch the same way, and a resumed run draws
    what the uninterrupted one drew."""
    key = np.random.SeedSequence([seed, epoch, batch]).generate_state(2, np.uint32)
    return torch.Generator().manual_seed(int(key[0]) << 32 | int(key[1]))


def passes_loss(model, passes: list[dict], targets) -> torch.Tensor:
    """The micro-batch's loss: the sum of the model's losses over its passes (one pass without
    augment perturbations; with them, L(batch) + L(p(batch)) for each, the authors' summed step).
    `targets(batch)` gives the label tensors of a pass."""
    losses = [model(b, targets(b))["loss"] for b in passes]
    return torch.stack(losses).sum() if len(losses) > 1 else losses[0]


def train_subset(examples: list, n: int | None, how: str, seed: int) -> list:
    """`data.max_train_examples` of `examples`: the first n, or n drawn with `seed` (kept in file order)."""
    if not n or n >= len(examples):
        return examples
    if how == "random":
        return [examples[i] for i in sorted(random.Random(seed).sample(range(len(examples)), n))]
    return examples[:n]
