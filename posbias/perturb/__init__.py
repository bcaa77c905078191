"""Training-time input perturbations (one per file; registered in `posbias.registry.PERTURBATIONS`).

A perturbation is any callable `(batch, generator) -> batch` that returns a new batch dict
(it must not modify its input) — e.g. shifting `position_ids` (Random Padding). They run on
training batches only; evaluation and prediction never see them. Each is built from its config
entry `{name: ..., **options}` by its registered factory `(options, cfg, key) -> callable` (`key`
is the dotted config key for error messages). A perturbation may also have `bind(model)`, called
once the model exists (e.g. to learn its position numbering and refuse impossible settings).
"""
from __future__ import annotations

from ..registry import PERTURBATIONS


def build_perturbations(specs: list[dict], cfg) -> list:
    out = []
    for i, spec in enumerate(specs):
        options = {k: v for k, v in spec.items() if k != "name"}
        out.append(PERTURBATIONS.get(spec["name"], f"perturb[{i}].name")(options, cfg, key=f"perturb[{i}]"))
    return out


from . import position_shift  # noqa: E402,F401  (registers random_padding)
