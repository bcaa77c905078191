"""Training-time input perturbations (one per file; registered in `posbias.registry.PERTURBATIONS`).

Protocol. A perturbation is any callable `(batch, generator) -> batch` that returns a new batch dict
(it must not modify its input) — e.g. shifting `position_ids` (Random Padding, Random Position
Perturbation in `position_shift.py`) or concatenating rows (Context Perturbation in
`context_concat.py`). Randomness comes only from the `torch.Generator` passed in, so a run is
reproducible. They run on training batches only; evaluation and prediction never see them. Each is
built from its config entry `{name: ..., mode: ..., **options}` by its registered factory
`(options, cfg, key) -> callable` (`key` is the dotted config key for error messages). A
perturbation may also have `bind(model, tokenizer)`, called once the model exists (to learn its
position numbering and the tokenizer's special tokens, and to refuse impossible settings).

Modes (`mode` in each entry, default `replace`):
- `replace`: the perturbations with mode replace are applied in config order to the batch, and the
  step trains on the result. Cost: whatever the perturbed batch costs (Random Padding and RPP
  nothing extra; Context Perturbation rows of up to M tokens instead of one sentence each).
- `augment`: each perturbation with mode augment adds one more forward pass on its own perturbed
  copy of that (replace-perturbed) batch; the step's loss is the sum
  L(batch) + sum over augment perturbations of L(p(batch)), with one backward of the sum (divided by
  the gradient-accumulation count). This is the authors' training step (a clean step and a
  perturbed step, losses summed). Cost: every augment perturbation adds a full forward + backward
  per micro-batch (twice the compute for one; with CP also its longer rows), and the activations
  of all passes are held until the backward. The logged loss is the sum; the throughput window and
  the position-update counter count the tokens of every pass.
"""
from __future__ import annotations

from ..errors import ConfigError
from ..registry import PERTURBATIONS

MODES = ("replace", "augment")


def check_mode(value, key: str) -> str:
    """`value` if it is a known mode; `key` is the perturbation's dotted key (`perturb[i]`)."""
    if value not in MODES:
        raise ConfigError(f"{key}.mode must be one of {list(MODES)}, got {value!r}")
    return value


def _split(spec, i: int) -> tuple[str, dict, str]:
    key = f"perturb[{i}]"
    if not isinstance(spec, dict) or "name" not in spec:
        raise ConfigError(f"{key} must be a mapping with a name, got {spec!r}")
    mode = check_mode(spec.get("mode", "replace"), key)
    options = {k: v for k, v in spec.items() if k not in ("name", "mode")}
    return spec["name"], options, mode


def build_perturbations(specs: list[dict], cfg, *, with_modes: bool = False) -> list:
    """The perturbations of `specs` (a run config's `perturb` list), in config order.

    With `with_modes`, (perturbation, mode) pairs. `mode` is taken off each entry before its
    factory sees the options; an unknown mode raises a ConfigError naming `perturb[i].mode`.
    """
    out = []
    for i, spec in enumerate(specs):
        name, options, mode = _split(spec, i)
        p = PERTURBATIONS.get(name, f"perturb[{i}].name")(options, cfg, key=f"perturb[{i}]")
        out.append((p, mode) if with_modes else p)
    return out


def perturbations_by_mode(specs: list[dict], cfg) -> tuple[list, list]:
    """(replace, augment): the perturbations of each mode, each list in config order."""
    built = build_perturbations(specs, cfg, with_modes=True)
    return [p for p, m in built if m == "replace"], [p for p, m in built if m == "augment"]


def training_passes(batch: dict, replace: list, augment: list, generator) -> list[dict]:
    """The batches one micro-step trains on: `batch` after every replace perturbation (in order),
    then one copy of that batch per augment perturbation. Their losses are summed."""
    for p in replace:
        batch = p(batch, generator)
    return [batch] + [p(batch, generator) for p in augment]


from . import context_concat, position_shift  # noqa: E402,F401  (register the built-in perturbations)
