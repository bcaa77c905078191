"""What a training run records as it goes, beside its weights: the output folder made ready
(config.yaml, run_info.json `running`, the trackers), a train_log.jsonl line every `train.log_every`
steps, the losses read off the device and checked for divergence (NaN/inf) before anything is logged,
evaluated or saved, and run_info.json rewritten `failed` when the run dies (`RunRecord`).

The functions taking `run` and `loop` are stages of the loop in `posbias.training`: `run` is its
`_Run` (the run's state), `loop` its `_Loop` (where the loop is).
"""
from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path

import torch

from . import outputs
from .config import save_config
from .errors import ConfigError, TrainingError, failure_message
from .train_state import read_trainer_state
from .utils import atomic_write_json, atomic_write_text, now_iso


# ---- the output folder and run_info.json


# Every name training writes in train.output_dir: none may be a link (`outputs.no_link`).
WRITTEN = ("best", "best.tmp", "best.old", "eval", "eval.tmp", "eval.old", "checkpoints", "checkpoints/last",
           "checkpoints/last.tmp", "checkpoints/last.old", "data_order", "train_log.jsonl", "eval_log.jsonl",
           "config.yaml", "run_info.json", "position_updates.json")


def check_output_dir(out: Path, key: str) -> None:
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


class RunRecord:
    """What a failed run leaves in `run_info.json`: once this attempt owns the run (it wrote
    run_info.json as `running`, or it is resuming the run after the checks), any exception —
    a damaged checkpoint, a full disk, a bug, Ctrl-C or SIGTERM (`posbias.interrupt`) — rewrites it
    as `failed` (`interrupted`), with `finished` and the one-line `error`, so that no dead run reads
    `running`."""

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


def start_output(run, resume: str | None, record: RunRecord) -> None:
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
                truncate_log(out / log, run.state["global_step"])
        save_config(run.cfg, out / "config.yaml")
        record.path, record.info = out / "run_info.json", run.run_info
        atomic_write_json(out / "run_info.json", run.run_info)
    if run.log_with:
        run.acc.init_trackers(out.name or "posbias", config=flat_config(run.cfg.to_dict()))


def truncate_log(path: Path, last_step: int) -> None:
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


# ---- log lines and trackers


def new_window() -> dict:
    """Loss and throughput since the last log line. `pending`: (step, loss) of the micro-batches
    whose loss is still on the device, read by `read_losses` when a log line, an evaluation or a
    checkpoint is due (one device -> host copy there, none per step)."""
    return {"loss": 0.0, "n": 0, "examples": 0, "tokens": 0, "padded": 0, "t0": time.perf_counter(),
            "pending": []}


def log_step(run, loop) -> None:
    """A train_log.jsonl line (main process), the progress bar or line, the trackers; then a new window."""
    read_losses(run, loop)
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
    loop.window = new_window()


def tracker_names(names: list[str]) -> list[str] | None:
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


def flat_config(d: dict, prefix: str = "") -> dict:
    """The run config as flat scalar hyper-parameters (trackers such as TensorBoard take no nesting)."""
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flat_config(v, key + "."))
        elif isinstance(v, (int, float, str, bool)):
            out[key] = v
        else:
            out[key] = json.dumps(v)
    return out


# ---- the losses, read off the device, and divergence


def read_losses(run, loop) -> None:
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


def raise_if_diverged(run, loop) -> None:
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
        done = read_trainer_state(last_dir / "trainer_state.json")["global_step"]
        where = f"the last good checkpoint is {last_dir} (step {done})"
    except (ConfigError, OSError):
        where = "no checkpoint was saved before it"
    what = f"the training loss is {value}" if value is not None else "the training loss of another process is not finite"
    raise TrainingError(f"{out}: {what} at step {step}; stopped, nothing of that step or after was saved, "
                        f"{where}. "
                        "Lower train.lr, set train.max_grad_norm, or check the data")

