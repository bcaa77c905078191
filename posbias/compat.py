"""Compatibility of configs over time: their version, the steps that bring an old one up to date, and
which keys make up a run's identity (its config hash). One home for what used to be seven separate
mechanisms in config.py, qa/config.py and training.py.

Policy.

- **A config key that changes behaviour** (a new key whose default is not what configs without it
  did, or a changed default): bump `CONFIG_VERSION` by adding one step to `STEPS`, a small named
  function `_vN_to_vN1(d, task)` that gives a config of the old version the value that keeps its
  old behaviour, with its own test in `tests/core/test_compat.py`; mark the field `neutral=` that old
  value, so that the runs recorded before keep their hashes. The step is the only place that
  remembers what old configs meant.
- **A key that changes nothing at one value** (added after runs were recorded, e.g. early stopping
  off): mark its field `marks(neutral=value)`, so that at that value it stays out of the hash and
  recorded runs keep their hashes. `omit=True` also leaves it out of the written config there.
- **A key that is not part of what a run is** (where it is written, the device, trackers): mark it
  `marks(hash=False)`. `marks(resumable=True)`: it may change when a run resumes from a checkpoint.
  (Numeric fields pass the same keywords to `posbias.config.bounded`.)
- **A renamed key** (the same setting under a new name): bump the version with a step that renames
  it in configs posbias wrote (`_rename`), and mark the field `marks(old_name=...)` in the task that
  used the old name: the hash takes the key under its old name there, so recorded runs keep their
  hashes, and a user's config or override that still spells the old name is read under the new one
  with a FutureWarning (`current_names`; both names at once are a ConfigError).

Versions. Every config posbias writes (a checkpoint's `posbias.yaml`, a run's `config.yaml`, an
experiment's `run_config.yaml` and the configs in its store) carries `config_version` at the top.
Reading one, `migrate` applies the steps from its version to the current one. A config without the
key is version 0 (written before versions) when posbias wrote it (`build_config(saved=True)`: a
checkpoint, a recorded run), and current when a user wrote it (users do not write versions). A
version newer than this code's is refused, naming the file.

The hash of a config (`config_hash`) is that of its written form less the fields marked above; it
must never change for a config that means the same run: experiment stores (`docs/experiments/`)
recorded runs under it, and `experiment run` skips a finished run only when the hash matches
(`tests/core/test_compat.py` holds frozen hashes).

This module imports no task package (and no torch): the task configs mark their own fields.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import warnings
from typing import get_args, get_type_hints

from .errors import ConfigError

VERSION_KEY = "config_version"

_UNSET = object()


class AnyOf(tuple):
    """`marks(neutral=AnyOf(a, b))`: a key left out of the hash at either value (e.g. None where it
    does not apply, and the value runs recorded before it existed had). `omit` omits at the first."""

    def __new__(cls, *values):
        return super().__new__(cls, values)


def at_neutral(m: dict, value) -> bool:
    """Whether `value` is the neutral value (one of them, for `AnyOf`) of a field with marks `m`."""
    if "neutral" not in m:
        return False
    neutral = m["neutral"]
    return value in neutral if isinstance(neutral, AnyOf) else value == neutral


def marks(*, hash: bool = True, neutral=_UNSET, omit: bool = False, hash_only_with: str | None = None,
          resumable: bool = False, old_name: str | None = None) -> dict:
    """Dataclass field metadata for the compatibility rules of a config key (module doc):
    `hash=False`: never part of the config hash; `neutral=v`: added later, left out of the hash at
    `v`; `omit=True` (with `neutral`): also left out of the written config at `v`;
    `hash_only_with="perturb"`: part of the hash only while that top-level key is non-empty;
    `resumable=True`: may change when a run resumes; `old_name="doc_stride"`: the key's name (in
    the same section) before a step renamed it: the hash takes the key under that name, and a
    user's config that spells it is read with a FutureWarning (`current_names`)."""
    if omit and neutral is _UNSET:
        raise ValueError("marks(omit=True) needs the neutral value it is omitted at")
    out: dict = {}
    if not hash:
        out["hash"] = False
    if neutral is not _UNSET:
        out["neutral"] = neutral
    if omit:
        out["omit"] = True
    if hash_only_with:
        out["hash_only_with"] = hash_only_with
    if resumable:
        out["resumable"] = True
    if old_name:
        out["old_name"] = old_name
    return out


# -- versions -------------------------------------------------------------------------------------

def _fill(d: dict, section: str, key: str, value) -> None:
    """`d[section][key] = value` unless the config sets it (a section that is not a mapping is left
    for the config's own check to name)."""
    current = d.get(section)
    if current is None:
        d[section] = {key: value}
    elif isinstance(current, dict) and key not in current:
        d[section] = {**current, key: value}


def _v0_to_v1(d: dict, task: str) -> dict:
    """Written before config versions. Three keys came later (issue 29) with a default that changes
    behaviour, to follow the papers; a config without them meant their old behaviour."""
    if task == "qa":
        # DyReF's softmax ran over the context only (Eq. 1 sums over all tokens: now `all`).
        _fill(d, "model", "softmax_over_default", "context")
    if task in ("qa", "tagging"):
        # A perturb entry without `mode` replaced the batch; now RPP and CP add the authors' clean pass.
        _fill(d, "data", "perturb_default_mode", "replace")
    if task == "tagging":
        # D*'s length quantiles were taken of each file alone; now of train + dev (+ test) pooled, as
        # the paper's §3.1 distributions and the token-positional-bias authors' `trim_dataset`.
        _fill(d, "data", "length_pool", "split")
    return d


def _rename(d: dict, section: str, old: str, new: str) -> None:
    """`d[section][old]` renamed `new`, in place of the old key (so the written order stays); both
    set is a ConfigError (a section that is not a mapping is left for the config's own check)."""
    current = d.get(section)
    if isinstance(current, dict) and old in current:
        if new in current:
            raise ConfigError(f"{section}.{old} and {section}.{new} are both set: {section}.{old} is the old "
                              f"name of {section}.{new}; keep {section}.{new}")
        d[section] = {(new if k == old else k): v for k, v in current.items()}


def _v1_to_v2(d: dict, task: str) -> dict:
    """One name for the overlap of consecutive windows in every task (issue 45): QA's
    `data.doc_stride` (Hugging Face run_qa's name) is now `data.stride`, tagging's name and the
    tokenizer's argument that both pass it to. The same setting: QA's hash keeps the old name
    (the field's `old_name` mark)."""
    if task == "qa":
        _rename(d, "data", "doc_stride", "stride")
    return d


def _v2_to_v3(d: dict, task: str) -> dict:
    """The learned-mixin gate lost its bias term (issue 47: Clark et al.'s g(x) = softplus(w·h) and
    Ko et al.'s code have none): a QA config with `train.debias` written before had one."""
    train = d.get("train")
    debias = train.get("debias") if isinstance(train, dict) else None
    if task == "qa" and isinstance(debias, dict) and debias.get("method") in ("learned_mixin", "learned_mixin_h"):
        _fill(train, "debias", "gate_bias", True)
    return d


# STEPS[v] brings a config of version v to version v + 1.
STEPS = (_v0_to_v1, _v1_to_v2, _v2_to_v3)
CONFIG_VERSION = len(STEPS)


def config_version(d: dict, *, saved: bool, source: str | None = None) -> int:
    """The version of the config mapping `d`: its `config_version`, else 0 when posbias wrote it
    (`saved`) and the current version when a user did. A version that is not a whole number, or is
    newer than this code's, is a one-line ConfigError naming `source` (the file) and the key."""
    where = f"{source}: " if source else ""
    if VERSION_KEY not in d:
        return 0 if saved else CONFIG_VERSION
    v = d[VERSION_KEY]
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ConfigError(f"{where}{VERSION_KEY} must be a whole number from 0 to {CONFIG_VERSION}, got {v!r}")
    if v > CONFIG_VERSION:
        raise ConfigError(f"{where}{VERSION_KEY} {v} is newer than this posbias reads ({CONFIG_VERSION}): "
                          "a later posbias wrote it; upgrade posbias to read it")
    return v


def migrate(d: dict, *, task: str, saved: bool = False, source: str | None = None) -> dict:
    """`d` (not modified) brought from its version (`config_version`) to the current one by `STEPS`,
    without the `config_version` key: the config of the current version that means the same run."""
    version = config_version(d, saved=saved, source=source)
    out = {k: v for k, v in d.items() if k != VERSION_KEY}
    for step in STEPS[version:]:
        out = step(out, task)
    return out


def current_names(d: dict, cls, where: str = "") -> dict:
    """`d` (not modified), a user's config or overrides for config class `cls`, with each key that
    `cls` marks `old_name` read under its current name, and a FutureWarning naming both (`where`:
    the file or `override`, first in the message). Configs posbias wrote are renamed by their
    version's step instead, without a warning. Both names in one mapping: a ConfigError."""
    out = d
    for key, old in _marked(cls, "old_name").items():
        *path, new = key.split(".")
        section = out
        for p in path:
            section = section.get(p) if isinstance(section, dict) else None
        if not isinstance(section, dict) or old not in section:
            continue
        prefix = "".join(f"{p}." for p in path)
        if new in section:
            raise ConfigError(f"{where}{prefix}{old} and {prefix}{new} are both set: {prefix}{old} is the old "
                              f"name of {prefix}{new}; keep {prefix}{new}")
        warnings.warn(f"{where}{prefix}{old} is deprecated: the old name of {prefix}{new}, read as it; "
                      f"write {prefix}{new}", FutureWarning, stacklevel=3)
        out = _renamed(out, path, old, new)
    return out


def _renamed(d: dict, path: list[str], old: str, new: str) -> dict:
    """A copy of `d` with key `old` of the section at `path` renamed `new` in its place (the
    sections along `path` copied, the rest shared)."""
    if not path:
        return {(new if k == old else k): v for k, v in d.items()}
    return {**d, path[0]: _renamed(d[path[0]], path[1:], old, new)}


# -- the written form and the hash ----------------------------------------------------------------

def written_form(cfg) -> dict:
    """The config dataclass `cfg` as posbias writes it: `config_version` first, then every field,
    less those marked `omit` at their neutral value."""
    d = dataclasses.asdict(cfg)
    _drop(cfg, d, lambda m, value: m.get("omit") and at_neutral(m, value))
    return {VERSION_KEY: CONFIG_VERSION, **d}


def hashed_form(cfg) -> dict:
    """What the config hash is taken of: `cfg.to_dict()` less its version and the fields that are
    not part of the run, a renamed key under its old name (`marks` above)."""
    d = cfg.to_dict()
    d.pop(VERSION_KEY, None)

    def left_out(m: dict, value) -> bool:
        return (m.get("hash") is False or at_neutral(m, value)
                or ("hash_only_with" in m and not d.get(m["hash_only_with"])))

    _drop(cfg, d, left_out)
    _old_names(cfg, d)
    return d


def config_hash(cfg) -> str:
    """The stable hash of a config (16 hex digits): experiment stores record runs under it."""
    return hashlib.sha256(json.dumps(hashed_form(cfg), sort_keys=True).encode()).hexdigest()[:16]


def _drop(obj, d: dict, rule) -> None:
    """Delete from `d` (the dict form of dataclass `obj`) each field whose metadata and value `rule`
    says to leave out, nested sections included."""
    for f in dataclasses.fields(obj):
        if f.name not in d:
            continue
        value = getattr(obj, f.name)
        if rule(f.metadata, d[f.name]):
            del d[f.name]
        elif dataclasses.is_dataclass(value) and isinstance(d[f.name], dict):
            _drop(value, d[f.name], rule)


def _old_names(obj, d: dict) -> None:
    """Rename in `d` (the dict form of dataclass `obj`) each field marked `old_name` to that name,
    nested sections included."""
    for f in dataclasses.fields(obj):
        if f.name not in d:
            continue
        value = getattr(obj, f.name)
        if "old_name" in f.metadata:
            d[f.metadata["old_name"]] = d.pop(f.name)
        elif dataclasses.is_dataclass(value) and isinstance(d[f.name], dict):
            _old_names(value, d[f.name])


def _marked(cls, name: str, prefix: str = "") -> dict:
    """Dotted key -> metadata value `name`, for every field of config class `cls` (nested sections,
    also behind `X | None`, included) whose metadata has it."""
    hints, out = get_type_hints(cls), {}
    for f in dataclasses.fields(cls):
        key = prefix + f.name
        if name in f.metadata:
            out[key] = f.metadata[name]
        tp = hints[f.name]
        for member in (tp, *get_args(tp)):
            if dataclasses.is_dataclass(member):
                out.update(_marked(member, name, key + "."))
                break
    return out


def hash_neutral(cls) -> dict:
    """Dotted key -> the value at which that key of config class `cls` is left out of the hash."""
    return _marked(cls, "neutral")


def not_hashed(cls) -> set[str]:
    """The dotted keys of config class `cls` that are never part of its hash."""
    return {k for k, v in _marked(cls, "hash").items() if v is False}


def resumable_keys(cls) -> set[str]:
    """The dotted keys of config class `cls` that may change when a run resumes from a checkpoint
    (extending or re-scheduling it); any other change would make it another experiment."""
    return {k for k, v in _marked(cls, "resumable").items() if v}
