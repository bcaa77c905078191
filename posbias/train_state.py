"""A run's resume state: what `checkpoints/last` keeps, how a run resumes from it, and the checks
before it does.

`resolve_resume` picks the checkpoint to continue from and refuses a config that changed in a key
that may not (`check_resume`); `check_world_size` refuses another number of processes; `save_last`
writes the resumable checkpoint (weights, optimizer, scheduler, every process's RNG states, the fp16
loss scaler, trainer_state.json) and `load_resume` restores it, checking each file first;
`save_best` writes best/ and its eval/.

Stored without pickle: tensors in safetensors, everything else in JSON. A checkpoint is shared
between people and machines, so loading it must never run code (a pickle can). The optimizer and
scheduler state dicts and the RNG states are nested dicts / lists / tuples of plain values and
tensors: `save_state` walks such an object, moves each tensor into `training_state.safetensors`
under its path (e.g. `optimizer/state/3/exp_avg`) and writes the rest to `training_state.json`,
with the tensor's key in its place. Integer dict keys (the optimizer's parameter indices) and
tuples (Python's RNG state, AdamW's betas) are tagged so that they come back as they were.

Checkpoints written before this format hold `training_state.pt`, a pickle. `load_state` reads it
only through `torch.load(weights_only=True)` (tensors and plain containers; NumPy's RNG array is
allowed by name), which refuses any other object instead of running it.
"""
from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import torch

from . import outputs
from .checkpoint import MODEL_META, save_checkpoint
from .compat import resumable_keys
from .config import RunConfig, load_config
from .encoders import WEIGHTS, first_shape_error, weight_shapes
from .errors import ConfigError
from .limits import load_json
from .utils import atomic_write_json, recover_dir, replace_dir, save_safetensors

TENSORS = "training_state.safetensors"
PLAIN = "training_state.json"
LEGACY = "training_state.pt"
FORMAT = 1


# ---- a state stored without pickle


def _flatten(obj, path: str, tensors: dict):
    if isinstance(obj, torch.Tensor):
        tensors[path] = obj.detach().contiguous().cpu()
        return {"__tensor__": path}
    if isinstance(obj, np.ndarray):
        return {"__ndarray__": obj.tolist(), "dtype": str(obj.dtype)}
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, dict):
        if all(isinstance(k, str) for k in obj):
            return {"__dict__": {k: _flatten(v, f"{path}/{k}", tensors) for k, v in obj.items()}}
        if all(isinstance(k, int) and not isinstance(k, bool) for k in obj):
            return {"__intdict__": [[k, _flatten(v, f"{path}/{k}", tensors)] for k, v in obj.items()]}
        raise TypeError(f"{path}: dict keys must be all str or all int")
    if isinstance(obj, tuple):
        return {"__tuple__": [_flatten(v, f"{path}/{i}", tensors) for i, v in enumerate(obj)]}
    if isinstance(obj, list):
        return [_flatten(v, f"{path}/{i}", tensors) for i, v in enumerate(obj)]
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    raise TypeError(f"{path}: cannot store a {type(obj).__name__} in the training state")


def _unflatten(obj, tensors: dict, where: str):
    if isinstance(obj, list):
        return [_unflatten(v, tensors, where) for v in obj]
    if not isinstance(obj, dict):
        return obj
    if "__tensor__" in obj:
        key = obj["__tensor__"]
        if key not in tensors:
            raise ConfigError(f"{where}: tensor {key!r} is missing from {TENSORS}")
        return tensors[key]
    if "__ndarray__" in obj:
        return np.asarray(obj["__ndarray__"], dtype=np.dtype(obj["dtype"]))
    if "__dict__" in obj:
        return {k: _unflatten(v, tensors, where) for k, v in obj["__dict__"].items()}
    if "__intdict__" in obj:
        return {int(k): _unflatten(v, tensors, where) for k, v in obj["__intdict__"]}
    if "__tuple__" in obj:
        return tuple(_unflatten(v, tensors, where) for v in obj["__tuple__"])
    raise ConfigError(f"{where}: unexpected entry {sorted(obj)[:3]} in {PLAIN}")


def save_state(state: dict, folder) -> None:
    """Write `state` (plain values, tensors, NumPy arrays in dicts/lists/tuples) into `folder`."""
    folder = Path(folder)
    tensors: dict = {}
    plain = _flatten(state, "", tensors)
    save_safetensors(tensors, folder / TENSORS, metadata={"format": "posbias-training-state"})
    atomic_write_json(folder / PLAIN, {"format": FORMAT, "state": plain}, indent=None)


def load_state(folder) -> dict:
    """The state `save_state` wrote into `folder` (or a legacy `training_state.pt`, read safely)."""
    folder = Path(folder)
    if (folder / PLAIN).is_file():
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        doc = load_json(folder / PLAIN, "training state")
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise ConfigError(f"{folder / PLAIN}: not a posbias training state (format {FORMAT})")
        if not isinstance(doc.get("state"), dict):
            raise ConfigError(f"{folder / PLAIN}: no training state in it (its \"state\" entry is missing or "
                              "not an object); the checkpoint is damaged")
        try:
            tensors = load_file(str(folder / TENSORS))
        except (OSError, SafetensorError) as e:
            raise ConfigError(f"{folder / TENSORS}: cannot be read ({e})") from None
        try:
            return _unflatten(doc["state"], tensors, str(folder))
        except ConfigError:
            raise
        except (TypeError, ValueError, KeyError, AttributeError, IndexError) as e:  # a bad dtype, a malformed entry
            raise ConfigError(f"{folder / PLAIN}: a damaged entry ({type(e).__name__}: "
                              f"{' '.join(str(e).split())[:200]}); the checkpoint is damaged") from None
    if (folder / LEGACY).is_file():
        return _load_legacy(folder / LEGACY)
    raise ConfigError(f"{folder}: no training state ({PLAIN} + {TENSORS}) to resume from")


def _load_legacy(path: Path) -> dict:
    """A pre-safetensors `training_state.pt`, through the restricted unpickler: tensors, plain
    containers and NumPy's RNG array (its reconstruct function, ndarray and dtype, by name)."""
    import pickle

    try:
        from numpy._core.multiarray import _reconstruct
    except ImportError:  # NumPy 1.x
        from numpy.core.multiarray import _reconstruct
    allowed = [_reconstruct, np.ndarray, np.dtype, type(np.dtype(np.uint32))]
    try:
        with torch.serialization.safe_globals(allowed):
            return torch.load(path, weights_only=True, map_location="cpu")
    except (pickle.UnpicklingError, RuntimeError, EOFError, OSError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConfigError(f"{path}: refused to load this resume state: it holds objects other than tensors "
                          f"and plain values, which could run code ({first[:160]}); start the run again "
                          "with --overwrite, or fine-tune from its best/ weights") from None


# ---- resuming a run


def resolve_resume(cfg: RunConfig, resume: str | None, overwrite: bool) -> str | None:
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
        check_resume(cfg, Path(resume))
    if d.train_file is None:
        raise ConfigError("data.train_file must be set to train")
    if t.early_stopping_patience and not d.eval_file:
        raise ConfigError("train.early_stopping_patience needs data.eval_file (the metric it watches)")
    return resume


def check_resume(cfg: RunConfig, ckpt: Path) -> None:
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


def check_world_size(ckpt: Path, world: int) -> None:
    """Refuse to resume checkpoint `ckpt` with `world` processes when another number saved it: the
    batches each step takes, the schedule's length and the per-process random states depend on it.
    Checkpoints from before trainer_state.json had `world_size` tell it by their per-process random
    states."""
    try:
        saved = read_trainer_state(ckpt / "trainer_state.json").get("world_size")
    except Exception:  # a damaged trainer_state.json: load_resume names it, with the run owned
        return
    if saved is None:
        rng = load_state(ckpt).get("rng")
        saved = len(rng) if isinstance(rng, list) else world  # a damaged state is load_resume's to name
    if saved != world:
        raise ConfigError(f"cannot resume from {ckpt}: it was saved by {saved} process{'es' if saved != 1 else ''} "
                          f"and this run has {world}; resume with {saved} (the batch order, the learning-rate "
                          "schedule and each process's random state depend on it)")


# trainer_state.json: the loop's own state, each key with the types it may hold.
_TRAINER_STATE = {"global_step": (int,), "best_metric": (int, float, type(None)), "best_step": (int, type(None)),
                  "train_seconds": (int, float), "metric_name": (str, type(None)),
                  "evals_without_improvement": (int,), "stopped_early": (int, type(None)),
                  "position_updates": (dict, type(None)), "world_size": (int,)}


def read_trainer_state(file: Path) -> dict:
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


def load_resume(ckpt: Path, raw_model, optimizer, scheduler, rank: int, state: dict, updates,
                device=None, scaler=None) -> None:
    """Continue from checkpoint `ckpt`: its weights, optimizer, scheduler and RNG states (the CPU's,
    and this process's CUDA generator when it trains on one), the fp16 loss scaler and the loop's
    state. Every file is checked before it is used: a damaged or foreign one is a ConfigError naming
    it, not an error deep inside torch."""
    from safetensors.torch import load_file

    trainer = read_trainer_state(ckpt / "trainer_state.json")
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


# ---- saving checkpoints


def save_best(raw_model, cfg, tokenizer, out: Path, step: int, result: dict | None) -> None:
    """best/ from the weights of `step`, through best.tmp; with an evaluation `result`, its prediction
    files (eval.tmp, written by the evaluation) become eval/. Main process only."""
    tmp = outputs.fresh_dir(out / "best.tmp", "train.output_dir")
    save_checkpoint(raw_model, cfg, tokenizer, tmp, extra={"step": step, "metrics": result})
    replace_dir(tmp, out / "best")
    if result is not None:
        replace_dir(out / "eval.tmp", out / "eval")


def save_last(acc, raw_model, optimizer, scheduler, cfg, tokenizer, state, last_dir: Path, gather_object) -> None:
    """The resumable checkpoint `last_dir`, through last.tmp: the weights, the optimizer, scheduler and
    fp16 loss scaler states, every process's RNG states (gathered: a collective, so every process
    calls it), and trainer_state.json (`state`) last."""
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

