"""Training-time input perturbations (one per file; registered in `posbias.registry.PERTURBATIONS`).

Protocol. A perturbation is any callable `(batch, generator) -> batch` that returns a new batch dict
(it must not modify its input) — e.g. shifting `position_ids` (Random Padding, Random Position
Perturbation, Randomized Positions in `position_shift.py`) or concatenating rows (Context
Perturbation in `context_concat.py`). Randomness comes only from the `torch.Generator` passed in, so a run is
reproducible; the training loop seeds one per global batch (`posbias.training.batch_generator`:
seed, epoch, the batch's index in the epoch's order), so N processes perturb each batch as one does. They run on training batches only; evaluation and prediction never see them. Each is
built from its config entry `{name: ..., mode: ..., **options}` by its registered factory, which
takes the options as typed keywords (`posbias.factories`; posbias fills in `max_seq_len`, `task`
and `key`, the dotted config key for error messages, where the factory names them). A
perturbation may also have `bind(model, tokenizer)`, called once the model exists (to learn its
position numbering and the tokenizer's special tokens, and to refuse impossible settings).

Modes (`mode` in each entry). An entry without one takes `data.perturb_default_mode`: `paper`
(the default) gives each perturbation the step its paper trained with, or where the paper is
silent its authors' code (a perturbation's optional `paper_mode` attribute; `replace` without one):
`augment` for RPP and Context Perturbation, whose authors always add a clean pass (and without
which RPP never trains the positions 1 .. l - 1 its test sentences sit at: p_r >= l),
`replace` for Random Padding and Randomized Positions (Tao et al. and Ruoss et al. train on the
perturbed batch only). `replace` or
`augment` there applies that mode to every entry without one; configs saved before the key existed
read as `replace` (`posbias.compat._v0_to_v1`).
- `replace`: the perturbations with mode replace are applied in config order to the batch, and the
  step trains on the result. Cost: whatever the perturbed batch costs (the position shifts
  nothing extra; Context Perturbation rows of up to M tokens instead of one sentence each).
- `augment`: each perturbation with mode augment adds one more forward pass on its own perturbed
  copy of that (replace-perturbed) batch; the step's loss is the sum
  L(batch) + sum over augment perturbations of L(p(batch)), with one backward of the sum (divided by
  the gradient-accumulation count). This is the authors' training step (a clean step and a
  perturbed step, losses summed). Cost: every augment perturbation adds a full forward + backward
  per micro-batch (twice the compute for one; with CP also its longer rows), and the activations
  of all passes are held until the backward. The logged loss is the sum; the throughput window and
  the position-update counter count the tokens of every pass.

A replace perturbation that rebuilds rows (Context Perturbation, `rebuilds_rows`) after one that
sets position ids (RPP, Random Padding, Randomized Positions, `sets_positions`) would drop those
ids: the combination is refused by name (put the rebuilding one first, or make one of them augment).

`position_coverage` counts the position ids training reaches under given perturbations.
"""
from __future__ import annotations

import torch

from .. import factories
from ..errors import ConfigError
from ..registry import PERTURBATIONS

MODES = ("replace", "augment")
DEFAULT_MODES = ("paper", *MODES)  # data.perturb_default_mode


def check_mode(value, key: str) -> str:
    """`value` if it is a known mode; `key` is the perturbation's dotted key (`perturb[i]`)."""
    if value not in MODES:
        raise ConfigError(f"{key}.mode must be one of {list(MODES)}, got {value!r}")
    return value


def check_default_mode(cfg) -> str:
    """The run's `data.perturb_default_mode` (`paper` for a config object without one)."""
    value = getattr(getattr(cfg, "data", None), "perturb_default_mode", "paper")
    if value not in DEFAULT_MODES:
        raise ConfigError(f"data.perturb_default_mode must be one of {list(DEFAULT_MODES)}, got {value!r}")
    return value


def default_mode(perturbation, cfg) -> str:
    """The mode of an entry that names none (module doc): the perturbation's `paper_mode` under
    `data.perturb_default_mode: paper`, else that key's mode."""
    policy = check_default_mode(cfg)
    return getattr(perturbation, "paper_mode", "replace") if policy == "paper" else policy


def _split(spec, i: int) -> tuple[str, dict, str | None]:
    key = f"perturb[{i}]"
    if not isinstance(spec, dict) or "name" not in spec:
        raise ConfigError(f"{key} must be a mapping with a name, got {spec!r}")
    mode = check_mode(spec["mode"], key) if "mode" in spec else None  # None: the default (module doc)
    options = {k: v for k, v in spec.items() if k not in ("name", "mode")}
    return spec["name"], options, mode


def build_perturbation(name: str, options: dict, *, key: str = "perturb[0]", max_seq_len: int | None = None,
                       task: str | None = None):
    """One perturbation from its registered factory (`posbias.factories.build`: options checked by
    name and type), posbias filling in `max_seq_len` (data.max_seq_len), `task` and `key` for a
    factory that takes them (outside a run, a Hugging Face collator, `task` is None)."""
    filled = {"max_seq_len": max_seq_len, "task": task, "key": key}
    return factories.build(PERTURBATIONS.get(name, f"{key}.name"), options, key=key, what=name, filled=filled,
                           also=("mode",))


def check_combination(built: list[tuple[object, str]], names: list[str]) -> None:
    """Refuse a replace perturbation that rebuilds rows after a replace one that set position ids:
    the rebuilt rows are numbered afresh, so the shift would silently never be trained (the
    authors' code applies one method at a time; posbias can chain them, in the order that works).
    `names`: each entry's `name`, for the message."""
    shifted = None
    for i, (p, mode) in enumerate(built):
        if mode != "replace":
            continue  # an augment pass perturbs the replace result on its own: nothing is lost
        if getattr(p, "sets_positions", False):
            shifted = i
        elif getattr(p, "rebuilds_rows", False) and shifted is not None:
            raise ConfigError(
                f"perturb[{i}]: {names[i]} (mode replace) rebuilds the rows and numbers their positions afresh, "
                f"so the position ids of perturb[{shifted}] ({names[shifted]}, mode replace) would never be "
                f"trained; list perturb[{i}] first (the shift then moves the rebuilt rows), or set "
                f"perturb[{shifted}].mode or perturb[{i}].mode to augment")


def build_perturbations(specs: list[dict], cfg, *, with_modes: bool = False) -> list:
    """The perturbations of `specs` (a run config's `perturb` list), in config order.

    With `with_modes`, (perturbation, mode) pairs. `mode` is taken off each entry before its
    factory sees the options; an unknown mode raises a ConfigError naming `perturb[i].mode`; an
    entry without one gets `default_mode`. A combination that would lose a perturbation is refused
    (`check_combination`).
    """
    built, names = [], []
    for i, spec in enumerate(specs):
        name, options, mode = _split(spec, i)
        p = build_perturbation(name, options, key=f"perturb[{i}]",
                               max_seq_len=getattr(getattr(cfg, "data", None), "max_seq_len", None),
                               task=getattr(cfg, "task", None))
        built.append((p, mode or default_mode(p, cfg)))
        names.append(name)
    check_combination(built, names)
    return built if with_modes else [p for p, _ in built]


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


def position_coverage(lengths, replace: list, augment: list, *, n_positions: int, generator: torch.Generator,
                      base: int = 0, pad: int = 0, chunk: int = 4096) -> torch.Tensor:
    """How often training puts a token at each position id: (n_positions,) int64 counts.

    Simulates one training step (`training_passes`) over rows of `lengths` real tokens each ([CLS]
    first, then l - 1 tokens, right padding) and counts, over every pass, the real tokens at each
    position id (the encoder's own numbering from `base` where a pass sets none). With RPP in
    replace mode positions base + 1 .. base + l - 1 of a row of l tokens get nothing (p_r >= l);
    with the authors' clean pass (augment) every row also trains them.

    For perturbations that read only `attention_mask` and `cls_index` (the position shifts); `chunk`
    rows are perturbed at a time. A position id at or past `n_positions` is an error.

    Args:
        lengths: (N,) tokens per row, specials included.
        replace, augment: the perturbations of each mode (`perturbations_by_mode`), bound or not.
        n_positions: the position table's size (`max_position_embeddings`).
        base, pad: first position id and padding's id (RoBERTa: padding_idx + 1 and padding_idx).
    """
    lengths = torch.as_tensor(lengths, dtype=torch.long)
    counts = torch.zeros(n_positions, dtype=torch.long)
    for lo in range(0, len(lengths), chunk):
        part = lengths[lo: lo + chunk]  # (b,)
        mask = (torch.arange(int(part.max()))[None] < part[:, None]).long()  # (b, s)
        batch = {"attention_mask": mask, "cls_index": torch.zeros(len(part), dtype=torch.long)}
        for seen in training_passes(batch, replace, augment, generator):
            pos = seen.get("position_ids")
            if pos is None:  # the encoder's own numbering
                pos = (mask.cumsum(-1) - 1 + base).masked_fill(mask == 0, pad)
            real = pos[seen["attention_mask"].bool()]  # (tokens,)
            if len(real) and int(real.max()) >= n_positions:
                raise ValueError(f"a perturbation put a token at position {int(real.max())}, past the "
                                 f"{n_positions}-entry position table")
            counts += torch.bincount(real, minlength=n_positions)
    return counts


from . import context_concat, position_shift  # noqa: E402,F401  (register the built-in perturbations)
