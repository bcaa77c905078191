"""Resumable training state without pickle: tensors in safetensors, everything else in JSON.

A checkpoint is shared between people and machines, so loading it must never run code (a pickle
can). The optimizer and scheduler state dicts and the RNG states are nested dicts / lists / tuples
of plain values and tensors: `save_state` walks such an object, moves each tensor into
`training_state.safetensors` under its path (e.g. `optimizer/state/3/exp_avg`) and writes the rest
to `training_state.json`, with the tensor's key in its place. Integer dict keys (the optimizer's
parameter indices) and tuples (Python's RNG state, AdamW's betas) are tagged so that they come
back as they were.

Checkpoints written before this format hold `training_state.pt`, a pickle. `load_state` reads it
only through `torch.load(weights_only=True)` (tensors and plain containers; NumPy's RNG array is
allowed by name), which refuses any other object instead of running it.
"""
from __future__ import annotations

from pathlib import Path

from .errors import ConfigError
from .limits import load_json
from .utils import atomic_write_json, save_safetensors

TENSORS = "training_state.safetensors"
PLAIN = "training_state.json"
LEGACY = "training_state.pt"
FORMAT = 1


def _flatten(obj, path: str, tensors: dict):
    import numpy as np
    import torch

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
    import numpy as np

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

    import numpy as np
    import torch

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
