"""Numeric precision of a run: `train.mixed_precision` (training) and `train.eval_precision` /
`--precision` (evaluation, prediction, diagnosis).

Values: `fp32` (training: `no`, accelerate's word), `bf16`, `fp16`, and `auto`: bf16 where the
hardware computes it natively (a CPU with AMX-BF16 or AVX512-BF16, a CUDA GPU with bf16), else fp32,
since emulated bf16 is slower than fp32. Mixed precision is autocast: the weights stay fp32, the
encoder's matrix products run in the low precision, and posbias's heads, masks, softmaxes, losses and
metrics run in fp32 (`QAModel` / `TaggingModel` leave autocast before their heads).

Who decides a training run's precision (`training_precision`): `train.mixed_precision` when it says
something (`fp32`, `bf16`, `fp16`, `auto`); at `no`, the default, accelerate's choice:
ACCELERATE_MIXED_PRECISION, which `accelerate launch --mixed_precision X` and the user's accelerate
config set, else fp32. TF32 matrix products (`torch.backends.cuda.matmul.allow_tf32`,
`torch.set_float32_matmul_precision`) are left as the user set them.
"""
from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, replace
from pathlib import Path

from .errors import ConfigError

VALUES = ("no", "fp32", "bf16", "fp16", "auto")  # `no` (accelerate's word) = fp32


@dataclass(frozen=True)
class Precision:
    """What a run computes in: `name` is fp32, bf16 or fp16; `reason` says why (for `auto`, what
    the hardware has); `requested` is the config's value; `source`, for training, who chose it
    (`train.mixed_precision`, `accelerate`: the launch flag or config, or `default`)."""
    name: str
    reason: str
    requested: str
    source: str = ""

    @property
    def accelerate(self) -> str:
        """accelerate's `mixed_precision` value."""
        return "no" if self.name == "fp32" else self.name

    @property
    def dtype(self):
        import torch

        return {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[self.name]

    def to_dict(self) -> dict:
        out = {"precision": self.name, "requested": self.requested, "reason": self.reason}
        return {**out, "source": self.source} if self.source else out


def _cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def native_bf16(device) -> tuple[bool, str]:
    """(whether `device` computes bf16 natively, the reason in words)."""
    import torch

    if device.type == "cuda":
        try:
            ok = torch.cuda.is_bf16_supported(including_emulation=False)
        except TypeError:  # older torch: no emulation argument
            ok = torch.cuda.is_bf16_supported()
        name = torch.cuda.get_device_name(device)
        return ok, f"{name} {'supports' if ok else 'does not support'} bf16"
    if device.type != "cpu":
        return False, f"{device.type}: bf16 speed not established here"
    cpu = getattr(torch, "cpu", None)
    amx = _probe(cpu, "_is_amx_tile_supported")
    avx = _probe(cpu, "_is_avx512_bf16_supported")
    flags = _cpu_flags() if amx is None or avx is None else set()
    amx = amx if amx is not None else "amx_bf16" in flags
    avx = avx if avx is not None else "avx512_bf16" in flags
    if amx:
        return True, "CPU has AMX-BF16"
    if avx:
        return True, "CPU has AVX512-BF16"
    return False, "CPU has neither AMX-BF16 nor AVX512-BF16 (bf16 would be emulated, slower than fp32)"


def _probe(module, name: str) -> bool | None:
    fn = getattr(module, name, None)
    if fn is None:
        return None
    try:
        return bool(fn())
    except Exception:  # noqa: BLE001 - a probe that fails tells nothing
        return None


def resolve_precision(spec: str, device, key: str = "train.eval_precision") -> Precision:
    """The precision `spec` means on `device`; a value outside the allowed ones is an error naming `key`."""
    if spec not in VALUES:
        raise ConfigError(f"{key} must be one of {', '.join(VALUES)}, got {spec!r}")
    name = "fp32" if spec in ("no", "fp32") else spec
    if spec == "auto":
        ok, why = native_bf16(device)
        return Precision("bf16" if ok else "fp32", f"auto: {why}", spec)
    if name == "fp32":
        return Precision("fp32", "asked for", spec)
    if name == "bf16":
        ok, why = native_bf16(device)
        return Precision("bf16", "asked for" + ("" if ok else f"; {why}"), spec)
    if device.type == "cpu":
        return Precision("fp16", "asked for; CPU fp16 autocast is rarely faster than fp32", spec)
    return Precision("fp16", "asked for", spec)


# accelerate's environment variable for its precision: `accelerate launch --mixed_precision X` sets it,
# from the flag or from the user's accelerate config (`accelerate config`).
ACCELERATE_ENV = "ACCELERATE_MIXED_PRECISION"


def training_precision(spec: str, device, key: str = "train.mixed_precision") -> Precision:
    """The precision a training run on `device` computes in. `spec` (`train.mixed_precision`) wins
    when it says something; at `no` (its default) the choice is accelerate's, as in a script
    that builds `Accelerator()` itself: ACCELERATE_MIXED_PRECISION (the launch flag or config), else
    fp32. A value of that variable posbias cannot train in (fp8) is an error naming it."""
    if spec != "no":
        return replace(resolve_precision(spec, device, key), source=key)
    chosen = os.environ.get(ACCELERATE_ENV, "").strip().lower()
    if not chosen:
        return Precision("fp32", f"default ({key} no, and no accelerate launch flag or config)", spec, "default")
    if chosen not in ("no", "bf16", "fp16"):
        raise ConfigError(f"{ACCELERATE_ENV}={chosen} (accelerate launch --mixed_precision, or its config): posbias "
                          f"trains in no (fp32), bf16 or fp16; set {key} to choose one")
    resolved = resolve_precision(chosen, device, ACCELERATE_ENV)
    why = f"accelerate launch flag or config ({ACCELERATE_ENV}={chosen})"
    return Precision(resolved.name, resolved.reason.replace("asked for", why, 1), spec, "accelerate")


def autocast(device, precision: Precision):
    """The autocast context for running a model in `precision` on `device` (none for fp32)."""
    import torch

    if precision.name == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=precision.dtype)


def full_precision(*tensors):
    """A context leaving autocast for the device of `tensors` (heads, masks, losses run in fp32)."""
    import torch

    for t in tensors:
        if isinstance(t, torch.Tensor):
            kind = t.device.type
            if torch.is_autocast_enabled(kind):
                return torch.autocast(device_type=kind, enabled=False)
            break
    return contextlib.nullcontext()


def to_float(obj):
    """`obj` with every low-precision floating tensor (in tuples, lists, dicts) cast to fp32."""
    import torch

    if isinstance(obj, torch.Tensor):
        return obj.float() if obj.is_floating_point() and obj.dtype != torch.float32 and obj.dtype != torch.float64 else obj
    if isinstance(obj, tuple):
        return type(obj)(*map(to_float, obj)) if hasattr(obj, "_fields") else tuple(map(to_float, obj))
    if isinstance(obj, list):
        return [to_float(x) for x in obj]
    if isinstance(obj, dict):
        return {k: to_float(v) for k, v in obj.items()}
    return obj


def mask_min(dtype):
    """The additive value that masks a score out: the most negative number of `dtype` that bf16
    (and fp16, for fp16) also holds, so that the mask stays finite when autocast casts it down
    (float32's minimum becomes -inf in bf16, and a row of -inf becomes NaN in a softmax)."""
    import torch

    return max(torch.finfo(dtype).min, torch.finfo(torch.bfloat16).min)
