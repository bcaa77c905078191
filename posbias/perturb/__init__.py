"""Training-time input perturbations (one per file; registered in `posbias.registry.PERTURBATIONS`).

A perturbation is any callable `(batch, generator) -> batch` that returns a new batch dict
(it must not modify its input) — e.g. shifting `position_ids` (Random Padding). They run on
training batches only; evaluation and prediction never see them. Each is built from its config
entry `{name: ..., **options}` by its registered factory `(options, cfg) -> callable`.
"""
from __future__ import annotations

from ..registry import PERTURBATIONS


def build_perturbations(specs: list[dict], cfg) -> list:
    out = []
    for i, spec in enumerate(specs):
        options = {k: v for k, v in spec.items() if k != "name"}
        out.append(PERTURBATIONS.get(spec["name"], f"perturb[{i}].name")(options, cfg))
    return out
