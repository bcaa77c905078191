"""Position shifting, one mechanism with three samplers, as training-time perturbations.

Mechanism (`shift_position_ids`): every real token but the leading special ([CLS], <s>) gets the
position id `original + k` for a per-row shift k (Random Padding, RPP), or `original + k_j` for a
per-token shift k_j of the row's j-th moved token (Randomized Positions); [CLS] keeps its base
position, padding gets the encoder's pad position. Positions are counted over the attention mask, so
left or right padding and any pad id give the same numbering.

Sampler 1, Random Padding (Tao et al., "A Frustratingly Easy Improvement for Position Embeddings via
Random Padding", §3 and App. D), registered `random_padding`. It moves k of the n - m padding tokens
of a window to just after [CLS]:
    [CLS] {k [PAD]} question [SEP] context [SEP] {(n - m - k) [PAD]},   k ~ U{0 .. n - m}
With absolute position embeddings and masked padding this is exactly the same as keeping the
window unpadded and giving every token after [CLS] the position id `original + k` ([CLS] stays at
position 0): padding only ever contributes through masked attention (weight 0). So posbias shifts
position ids and keeps dynamic padding (tests/perturb/test_position_shift.py proves the equivalence on
logits and encoder gradients against the literal pad-moving input).

Sampler 2, Random Position Perturbation (Ben Amor et al., "Impact of Position Bias on Language
Models in Token Classification", §4.1, Fig. 8), registered `random_position_perturbation` (alias
`rpp`). The first token after [CLS] moves to a random position p_r, every later token with it:
    tau = p_r - 1,   p_r ~ U{l .. M - l}   (the paper's interval I = [l_t, M - l_t])
with l the row's real tokens (specials included) and M the position-table length counted from the
first position id (`max_len`; default the encoder's usable table, max_position_embeddings - base).
The authors' code (method/position_shift.py) draws k from range(m, M - m) and adds k itself:
their shift is one higher at the bottom, equal at the top; posbias implements the paper.
Guard: for rows with l > M - l (longer than half the table) the paper's interval is empty, and
p_r is drawn from {1 .. M - l + 1}, every start that still fits (the authors' code raises there).
Rows without a leading special (decoder tokenizers) move every token: p_r is then the first token's
own position, tau = p_r, and the fitting starts are {0 .. M - l}.
Since p_r >= l, the positions 1 .. l - 1 where a test sentence of l tokens sits are never trained by
RPP itself: an entry without a `mode` trains a clean and a perturbed pass (`augment`), as the
authors' code always did (`posbias.perturb`; `position_coverage` counts what each mode reaches).

Sampler 3, Randomized Positional Encodings (Ruoss et al., "Randomized Positional Encodings Boost
Length Generalization of Transformers", ACL 2023, §3, Fig. 1), registered `randomized_positions`.
A training row of n tokens gets a sorted random subset of size n of the positions {0 .. M - 1},
drawn uniformly without replacement, instead of 0 .. n - 1. posbias keeps [CLS] at its base like
the other samplers, so after [CLS] the l - 1 other real tokens get
    sorted random (l - 1)-subset of {base + 1 .. base + M - 1}     (uniform over all such subsets)
and a row without a leading special draws all l ids from {base .. base + M - 1}. Ids are strictly
increasing, the j-th moved token's shift k_j = v_j - j is non-negative and non-decreasing in j. M is
`max_len` (default the usable table, as for RPP); a row needs l <= M. Trained alone (`replace`), as
the paper does. Evaluation uses the ordinary positions 0 .. n - 1, as for every posbias perturbation
(the authors' code draws in the model's forward, evaluation included: models/transformer.py).

Shape legend: b batch, s sequence.
"""
from __future__ import annotations

import warnings

from typing import Annotated

import torch

from ..position_kind import position_kind
from ..errors import ConfigError
from ..registry import PERTURBATIONS
from ..typed import Bound


def shift_effect(config, takes_position_ids: bool = True) -> tuple[bool, str | None]:
    """(whether shifting position ids moves the words of an encoder with this config, a sentence
    saying why not, or what alone it moves; None for absolute position embeddings).

    Read from the config (`posbias.position_kind`): an absolute table is what Random
    Padding, RPP and shift mode act on. Relative attention (posbias's relative_key BERT, DeBERTa,
    T5) counts distances by slot, and rotary positions (ModernBERT, RoFormer, Llama) see only
    differences of ids: shifting every token but [CLS] moves no word relative to another. A model
    that also adds absolute embeddings of the ids to its input (DeBERTa's position_biased_input,
    MPNet) still sees those move.
    """
    kind = position_kind(config)
    if kind.kind == "none":
        return False, f"{kind}: shifted ids have no position table to index"
    if kind.kind != "absolute" and not kind.absolute_input:
        return False, f"{kind}: its attention sees distances between tokens, which shifted ids leave as they were"
    if not takes_position_ids:
        return False, f"the {kind.model_type} encoder's forward takes no position ids"
    if kind.kind != "absolute":
        return True, (f"{kind}: shifted ids move only its absolute input embeddings, not the distances its "
                      "attention sees")
    return True, None


def shift_position_ids(attention_mask: torch.Tensor, cls_index: torch.Tensor, shift: torch.Tensor, *,
                       base: int = 0, pad_position: int = 0) -> torch.Tensor:
    """(b, s) position ids: real tokens numbered from `base`, every real token but [CLS] moved by
    its shift; padding gets `pad_position`.

    Args:
        attention_mask: (b, s) 1 for real tokens.
        cls_index: (b,) position of [CLS] in each row (it keeps its unshifted id); -1 when the row
            has none (decoder tokenizers), and then every real token moves.
        shift: (b,) non-negative integers k, one per row; or (b, r) per token: the j-th moved real
            token of row b (in order, [CLS] not counted) moves by shift[b, j], r >= the most moved
            tokens of a row.
        base: first position id (0 for BERT/ELECTRA, padding_idx + 1 for RoBERTa).
    """
    mask = attention_mask.long()
    pos = mask.cumsum(-1) - 1 + base  # (b, s)
    moved = mask.bool().clone()
    has_cls = cls_index >= 0  # -1: no leading special token (GPT-2, BLOOM): every token moves
    rows = torch.arange(mask.shape[0], device=mask.device)
    moved[rows[has_cls], cls_index[has_cls]] = False
    if shift.dim() == 2:  # per token: slot -> rank among the row's moved tokens -> its shift
        rank = (moved.long().cumsum(-1) - 1).clamp(0, max(shift.shape[1] - 1, 0))  # (b, s)
        shift = shift.gather(1, rank) if shift.shape[1] else torch.zeros_like(rank)  # (b, s)
    else:
        shift = shift[:, None]  # (b, 1)
    pos = pos + moved.long() * shift
    return pos.masked_fill(mask == 0, pad_position)


def sample_random_padding(lengths: torch.Tensor, max_len: int, cap: int | None,
                          generator: torch.Generator) -> torch.Tensor:
    """k ~ Uniform{0 .. min(cap, max_len - m)} per window of m real tokens (App. D's cap K)."""
    hi = (max_len - lengths).clamp(min=0)
    if cap is not None:
        hi = hi.clamp(max=cap)
    u = torch.rand(lengths.shape, generator=generator)
    return torch.minimum((u * (hi + 1).double()).long(), hi)  # (b,), uniform over 0..hi


def sample_rpp_start(lengths: torch.Tensor, has_cls: torch.Tensor, max_len: int,
                     generator: torch.Generator) -> torch.Tensor:
    """p_r per row (§4.1): the new position of the first moved token, counted from the first
    position id ([CLS] = 0).

    p_r ~ U{l .. M - l} (the paper's interval I) when it is non-empty; otherwise (l > M - l) every
    start that still fits, U{f .. M - l + f}, with f = 1 after a [CLS] and 0 without one (the last
    real token then sits at M - 1 at most). Rows longer than M keep their positions (p_r = f).

    Args:
        lengths: (b,) l, real tokens per row, specials included.
        has_cls: (b,) bool, the row starts with a special token that keeps its position.
        max_len: M, position ids available from the first one (table length - base).
    """
    f = has_cls.long()  # (b,) unshifted position of the first moved token
    lo, hi = lengths.clone(), max_len - lengths  # (b,) the paper's interval I = [l, M - l]
    empty = lo > hi  # long rows: no start in I, fall back to every start that fits
    lo = torch.where(empty, f, lo)
    hi = torch.where(empty, (max_len - lengths + f).clamp(min=f), hi)  # clamp: rows longer than M stay put
    u = torch.rand(lengths.shape, generator=generator)
    return lo + torch.minimum((u * (hi - lo + 1).double()).long(), hi - lo)  # (b,), uniform over lo..hi


def sample_rpp(lengths: torch.Tensor, has_cls: torch.Tensor, max_len: int,
               generator: torch.Generator) -> torch.Tensor:
    """tau = p_r - 1 after a [CLS] (the paper's shift), p_r without one (every token moves)."""
    return sample_rpp_start(lengths, has_cls, max_len, generator) - has_cls.long()


def sample_randomized_positions(lengths: torch.Tensor, has_cls: torch.Tensor, max_len: int,
                                generator: torch.Generator) -> torch.Tensor:
    """(b, r) per-token shifts (Ruoss et al. §3): row b's r_b = l_b - f moved tokens get a sorted
    uniform random r_b-subset {v_0 < v_1 < ...} of {0 .. M - 1 - f}, i.e. the ids base + f + v_j, so
    the j-th moved token (at base + f + j unshifted) moves by v_j - j. f = 1 after a [CLS] (it keeps
    base), 0 without one. Columns j >= r_b are 0 (no token there).

    A uniform random subset: the first r_b of a random permutation of the pool (argsort of float64
    uniform keys: ties have probability ~ M^2 / 2^53), sorted. One draw per row, unlike the
    authors' code (models/positional_encodings.py, noisy_fixed_positional_encodings), which draws
    once per forward for the whole batch; the paper assigns one to "each training example" (Fig. 1).

    Raises ValueError for a row longer than M (it has fewer than l distinct ids to draw from).

    Args:
        lengths: (b,) l, real tokens per row, specials included.
        has_cls: (b,) bool, the row starts with a special token that keeps its position.
        max_len: M, position ids available from the first one (table length - base).
    """
    f = has_cls.long()
    n_moved = lengths - f  # (b,) r
    pool = max_len - f  # (b,) how many ids the moved tokens may take: f .. M - 1
    if len(lengths) and bool((n_moved > pool).any()):
        raise ValueError(f"a row of {int(lengths[n_moved > pool].max())} tokens has fewer than that many "
                         f"position ids in max_len = {max_len}")
    width = max(int(n_moved.max()), 1) if len(lengths) else 1
    keys = torch.rand((len(lengths), max_len), generator=generator, dtype=torch.float64)  # (b, M)
    keys = keys.masked_fill(torch.arange(max_len) >= pool[:, None], 2.0)  # outside the pool: never among the first
    order = torch.arange(width)  # (w,) j
    chosen = keys.argsort(-1)[:, :width]  # (b, w): distinct v, uniformly random, the first r_b of them used
    used = order < n_moved[:, None]  # (b, w)
    v = torch.where(used, chosen, max_len).sort(-1).values  # (b, w) the subset ascending, unused columns last
    return torch.where(used, v - order, 0)  # (b, w) k_j = v_j - j >= 0


class PositionShift:
    """A training-time perturbation: draws shifts with `sampler`, sets batch["position_ids"] (and
    batch["position_shift"], the sampler's shifts).

    `sampler(lengths, has_cls, max_len, generator) -> (b,) shifts`, one per row, or (b, r) shifts,
    one per moved token (`shift_position_ids`). `max_len` None means the
    encoder's usable position table (max_position_embeddings - first position id), learnt in
    `bind`; `fallback_len` stands in before `bind` and for encoders without a table. `paper_mode`:
    the training mode its paper (or its authors' code) used, for entries that name none
    (`posbias.perturb`).
    """

    sets_positions = True  # a later replace perturbation that rebuilds rows would drop them (posbias.perturb)

    def __init__(self, sampler, max_len: int | None, key: str, fallback_len: int | None = None,
                 paper_mode: str = "replace"):
        self.paper_mode = paper_mode
        self.sampler = sampler
        self.requested_len = max_len
        self.max_len = max_len if max_len is not None else fallback_len
        self.fallback_len = fallback_len
        self.key = key  # the dotted config key, for error messages
        self.base, self.pad_position = 0, 0

    def bind(self, model, tokenizer=None) -> None:
        """Adopt the model's position numbering; refuse an encoder where shifted ids move no word
        (`shift_effect`: relative, rotary or no positions, read from its config) and shifts past its
        position table. (The tokenizer of the bind protocol is not needed: positions are counted
        over the mask.)"""
        config = model.encoder.config
        self.base, self.pad_position = model.position_base, model.position_pad
        inputs = getattr(model, "_inputs", None)
        moves, why = shift_effect(config, inputs is None or inputs.positions)
        if not moves:
            raise ConfigError(f"{self.key}: {why}; position shifting cannot train it (use an encoder with absolute "
                              "position embeddings, or context_perturbation)")
        if why:
            warnings.warn(f"{self.key}: {why}", stacklevel=2)
        n_pos = getattr(config, "max_position_embeddings", None)
        # A head may put positions before the tokens (DyReF's two queries): they take part of the table.
        offset = getattr(model, "position_offset", 0)
        if self.requested_len is None:
            self.max_len = n_pos - self.base - offset if n_pos is not None else self.fallback_len
        if n_pos is not None and self.base + self.max_len + offset > n_pos:
            default = "data.max_seq_len" if self.fallback_len is None else "the encoder's usable table"
            held = f" + {offset} head positions" if offset else ""
            raise ConfigError(
                f"{self.key}.max_len ({self.max_len}) + first position id ({self.base}){held} exceeds the encoder's "
                f"max_position_embeddings ({n_pos}); lower {self.key}.max_len (default {default})")

    def __call__(self, batch: dict, generator: torch.Generator) -> dict:
        lengths = batch["attention_mask"].sum(-1)  # (b,) m: real tokens, specials included
        shift = self.sampler(lengths, batch["cls_index"] >= 0, self.max_len, generator)  # (b,) or (b, r)
        out = dict(batch)  # a new batch: the input is not modified
        out["position_ids"] = shift_position_ids(batch["attention_mask"], batch["cls_index"], shift,
                                                 base=self.base, pad_position=self.pad_position)
        out["position_shift"] = shift
        return out


# Option types (`posbias.factories`): shifts and lengths are whole numbers of positions.
NonNegativeInt = Annotated[int, Bound(0, what="a non-negative integer")]


def _positive_len(max_len, key: str, hint: str = "") -> None:
    # 0 is not a silent stand-in for the default: null (or leaving it out) is the way to say that.
    if max_len == 0:
        raise ConfigError(f"{key}.max_len must be a positive integer{hint}, got 0"
                          + ("; leave it out or set null for data.max_seq_len" if hint else ""))


@PERTURBATIONS.register("random_padding")
def random_padding(*, max_len: NonNegativeInt | None = None, cap: NonNegativeInt | None = None,
                   max_seq_len: int | None = None, key: str = "perturb[0]") -> PositionShift:
    """Options: `max_len` n (default, or null: data.max_seq_len), `cap` K (App. D; default none).
    Trains on the re-padded batch only (`paper_mode` replace), as Tao et al. do."""
    _positive_len(max_len, key, " (n, the padded window length)")
    if max_len is None:
        max_len = max_seq_len
    return PositionShift(lambda lengths, has_cls, n, gen: sample_random_padding(lengths, n, cap, gen), max_len, key,
                         paper_mode="replace")


@PERTURBATIONS.register("rpp")
@PERTURBATIONS.register("random_position_perturbation")
def random_position_perturbation(*, max_len: NonNegativeInt | None = None, max_seq_len: int | None = None,
                                 key: str = "perturb[0]") -> PositionShift:
    """Options: `max_len` M (default: the encoder's usable position table, max_position_embeddings
    minus the first position id; data.max_seq_len for encoders without a table).

    `paper_mode` augment: the authors' training step adds the perturbed batch to the clean one
    (experiments/bert_position_bias.py); the paper is silent. In replace mode alone the positions a
    row of l tokens is tested at, 1 .. l - 1, are never trained (p_r >= l)."""
    _positive_len(max_len, key)
    return PositionShift(sample_rpp, max_len, key, fallback_len=max_seq_len, paper_mode="augment")


@PERTURBATIONS.register("randomized_positions")
def randomized_positions(*, max_len: NonNegativeInt | None = None, max_seq_len: int | None = None,
                         key: str = "perturb[0]") -> PositionShift:
    """Randomized Positional Encodings (Ruoss et al., ACL 2023, §3): each training row's ids are a
    sorted uniform random subset of the position range, [CLS] kept at its base (module doc).

    Options: `max_len` M, the range of ids from the first one (default: the encoder's usable
    position table, max_position_embeddings minus the first position id, as for RPP;
    data.max_seq_len for encoders without a table). It must hold a whole window: M >= data.max_seq_len
    (checked here), M within the table (checked in `bind`), and any longer row (e.g. Context
    Perturbation's concatenations) is refused when it comes.

    `paper_mode` replace: the paper trains with randomized positions only. With l much smaller than
    M the ordinary positions 1 .. l - 1, where evaluation puts a row, are each drawn with probability
    (l - 1) / (M - 1) per row: `mode: augment` adds the clean pass."""
    _positive_len(max_len, key)
    n = max_seq_len
    if max_len is not None and n is not None and max_len < n:
        raise ConfigError(f"{key}.max_len ({max_len}) must be >= data.max_seq_len ({n}): a window of n tokens "
                          "needs n distinct position ids")

    def sampler(lengths, has_cls, m, generator):
        try:
            return sample_randomized_positions(lengths, has_cls, m, generator)
        except ValueError as e:  # a row longer than M (e.g. rebuilt by an earlier perturbation)
            raise ConfigError(f"{key}.max_len: {e}; raise {key}.max_len (at most the usable position table) "
                              "or shorten the rows") from None

    return PositionShift(sampler, max_len, key, fallback_len=n, paper_mode="replace")
