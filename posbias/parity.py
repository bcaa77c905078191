"""Parity with Hugging Face: a model folder posbias imports must score what the folder's own
`AutoModelFor...` forward scores.

posbias wraps an imported task model's base encoder with its own heads (`posbias.qa.model.load_hf_qa`,
`posbias.tagging.model.load_hf_tagger`); an architecture whose task model does more than
`classifier(dropout(hidden))` would otherwise be scored as a different network, silently. Each
task runs a few small inputs through both forwards (`check_parity`) and refuses a folder whose
logits differ; export runs the same check the other way round.
"""
from __future__ import annotations

import contextlib

import torch

from .errors import ConfigError

# Relative tolerance: float32 kernels differ in the last bits between the fused paths HF and posbias
# may take (sdpa, batched matmuls); a head that is missing or different moves logits by far more.
PARITY_RTOL = 1e-4


def logits_mismatch(ours: torch.Tensor, theirs: torch.Tensor, rtol: float = PARITY_RTOL) -> float | None:
    """max |ours - theirs| when it exceeds `rtol * max(1, max |theirs|)` (a tolerance scaled to the
    logits' size), else None. Both are the logits at the same positions, any shape."""
    if ours.shape != theirs.shape:
        raise ValueError(f"logits of different shapes: {tuple(ours.shape)} vs {tuple(theirs.shape)}")
    if not theirs.numel():
        return None
    ours, theirs = ours.double(), theirs.double()
    if not torch.isfinite(ours).all() or not torch.isfinite(theirs).all():
        return float("inf")
    diff = (ours - theirs).abs().max().item()
    return diff if diff > rtol * max(1.0, theirs.abs().max().item()) else None


@contextlib.contextmanager
def fp32_eval(*modules):
    """Run `modules` in eval mode and float32 inside the block, then give each parameter and buffer
    back its dtype and each module its training mode (a bf16 folder stays bf16 for scoring)."""
    saved = []
    for m in modules:
        saved.append((m, m.training, [(t, t.dtype) for t in (*m.parameters(), *m.buffers()) if t.is_floating_point()]))
    try:
        for m, _, tensors in saved:
            m.eval()
            for t, dtype in tensors:
                if dtype != torch.float32:
                    t.data = t.data.float()
        with torch.no_grad():
            yield
    finally:
        for m, training, tensors in saved:
            m.train(training)
            for t, dtype in tensors:
                if t.dtype != dtype:
                    t.data = t.data.to(dtype)


@contextlib.contextmanager
def check_forwards(source, model, hf_model):
    """`fp32_eval` of posbias's `model` and `hf_model` for the check's forwards; a forward that fails
    on the small check input (a folder whose weights or tokenizer do not fit its config) is one
    line naming `source`, not a traceback from inside the model."""
    with fp32_eval(model, hf_model):
        try:
            yield
        except (RuntimeError, IndexError, ValueError) as e:
            raise ConfigError(f"{source}: {type(hf_model).__name__} fails on a small check input "
                              f"({type(e).__name__}: {' '.join(str(e).split())[:200]})") from None


def check_parity(source, hf_model, pairs, *, exporting: bool = False) -> None:
    """Refuse, in one line naming `source` and the Hugging Face class, when posbias's logits and the
    Hugging Face model's differ (`logits_mismatch`) on any of `pairs`, an iterable of (ours, theirs)
    logits at the positions posbias scores, computed lazily inside `fp32_eval` by the caller."""
    worst = None
    for ours, theirs in pairs:
        diff = logits_mismatch(ours, theirs)
        if diff is not None:
            worst = diff if worst is None else max(worst, diff)
    if worst is None:
        return
    name = type(hf_model).__name__
    if exporting:
        raise ConfigError(f"{source}: {name} would not reproduce this model's forward (its logits differ by "
                          f"{worst:.3g} on a check input); refusing to export a different network")
    raise ConfigError(f"{source}: posbias cannot reproduce {name}'s forward (its logits differ by {worst:.3g} on a "
                      "check input); refusing to score a different network")
