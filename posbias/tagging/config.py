"""The tagging run config: its `data` section and cross-field checks."""
from __future__ import annotations

from dataclasses import dataclass, field

from ..compat import marks
from ..config import DataConfig, ModelConfig, RunConfig, TrainConfig, bounded, choice
from ..errors import ConfigError, did_you_mean

POSITION_BATCH_TOKENS = 16_384
"""Padded tokens per forward batch of the duplicated-test-set evaluation by default (a memory bound)."""


@dataclass
class TaggingDataConfig(DataConfig, defaults={"max_seq_len": 256, "stride": 64}):
    """The data section of a tagging run: the shared keys (`posbias.config.DataConfig`), and how the
    files are read, labelled and cut."""

    format: str = "auto"
    """`conll`, `conllu`, or `auto` (CoNLL-U by suffix or by its 10 tab-separated columns)."""
    tag: str = "upos"
    """CoNLL-U: the column to learn, `upos` or `xpos`."""
    word_column: int = bounded(0)  # negative counts from the end
    """CoNLL: the column holding the word."""
    tag_column: int = bounded(-1)
    """CoNLL: the column holding the tag (negative counts from the end: CoNLL-2003's NER is -1)."""
    scheme: str = "auto"
    """Tag scheme of the files: `iob1`, `iob2`, `bioes` (entity tags, validated), `none` (POS and other
    per-word labels), or `auto` (CoNLL-U: none; CoNLL: detected, IOB1 converted to IOB2)."""
    label_scheme: str = "bioes"
    """Entity tags the model learns and predicts: `bioes` (the default; `iobes` names it too: IOBES,
    as the token-positional-bias authors trained CoNLL-2003 and OntoNotes), `iob2` (converted from
    the files' scheme), or `auto` (the files' scheme after IOB1 -> IOB2). Scores stay comparable:
    predictions are mapped back to the evaluated file's scheme (IOB2 for CoNLL-2003) and scored
    there. Per-word labels (POS, scheme none) are left as they are."""
    label_subtokens: str = "first"
    """`first`: a word's label sits on its first sub-token (the others carry no loss), and its
    prediction is read there; `all`: continuation sub-tokens are trained too (B-X -> I-X on them);
    `copy`: they are trained on the word's label as it is (`S-PER S-PER`), the token-positional-bias
    authors' `label_all_tokens`. The word's prediction is always read at its first sub-token; with
    `copy` the authors' sub-token F1 reads each sub-token's own (`f1_seqeval_subtoken`)."""
    length_quantiles: list | None = None  # checked whole in validate (a pair in [0, 1])
    """D* of the token-positional-bias paper (§3.2): `[0.25, 0.75]` (the paper's Q1, Q3; the authors'
    code used `[0.15, 0.75]`) keeps only the sentences whose word length lies between these
    quantiles of the length distribution `length_pool` names, for the training and the evaluation
    file alike (null: every sentence). Not carried over when a checkpoint evaluates another file;
    `posbias diagnose tagging` has its own `--quantiles` (and uses `length_pool` too)."""
    length_pool: str = field(default="pooled", metadata=marks(neutral="split"))
    """Whose sentence lengths the D* quantiles are taken of: `pooled` (the default, as the paper's
    §3.1 length distributions and the authors' `trim_dataset`): the lengths of every file in
    `length_pool_files` together, one pair of bounds for every file cut; `split`: each file's own.
    Configs saved before the key read as `split` (`posbias.compat._v0_to_v1`), left out of the hash."""
    length_pool_files: str | list[str] | None = bounded(None, 1, neutral=None)
    """The files whose sentence lengths `length_pool: pooled` pools: null = the run's `train_file`
    and `eval_file` (and, for a model without them, the file being cut). The authors pooled train,
    dev and test: list all three for their bounds (CoNLL-2003 at [0.15, 0.75]: 4 to 22 words)."""
    tags_column: str | None = field(default=None, metadata=marks(neutral=None))
    """The tag column of a `datasets.Dataset` given as data (default: the first of ner_tags, tags,
    labels, upos, pos_tags, xpos it has)."""
    label_map: dict[str, str] | None = field(default=None, metadata=marks(neutral=None))
    """Evaluating a model on data that names its classes otherwise: data entity type (or POS tag)
    -> the model's, e.g. {person: PER, location: LOC}; `O` drops a type. Without it, a data class
    the model does not know stops `evaluate`/`diagnose` with both label sets named."""

    def read_options(self) -> dict:
        """Keyword options of `posbias.tagging.readers.read_tagging` this section sets."""
        return {"format": self.format, "tag": self.tag, "word_column": self.word_column,
                "tag_column": self.tag_column, "scheme": self.scheme}


@dataclass
class TaggingConfig(RunConfig):
    """A token-classification run: `posbias train tagging`."""

    task: str = "tagging"
    """The task this config is for: `tagging` (`posbias train tagging`)."""
    model: ModelConfig = field(default_factory=ModelConfig)
    data: TaggingDataConfig = field(default_factory=TaggingDataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    perturb: list = field(default_factory=list)
    """Training-time input perturbations, each `{name: ..., options...}`."""

    def validate(self) -> None:
        """Tagging checks; each error names the dotted key(s) to change."""
        d, m = self.data, self.model
        if m.head is None:
            m.head = "linear"
        choice(m.head, ["linear"], "model.head")
        unknown = sorted(set(m.head_options) - {"dropout"})
        if unknown:
            raise ConfigError(f"model.head_options: unknown option {unknown[0]!r} for the linear token head"
                              + (did_you_mean(unknown[0], ["dropout"], prefix="model.head_options.") or " (dropout)"))
        choice(d.format, ["auto", "conll", "conllu"], "data.format")
        choice(d.tag, ["upos", "xpos"], "data.tag")
        choice(d.scheme, ["auto", "iob1", "iob2", "bioes", "none"], "data.scheme")
        if d.label_scheme == "iobes":  # seqeval's name for BIOES
            d.label_scheme = "bioes"
        choice(d.label_scheme, ["auto", "iob2", "bioes"], "data.label_scheme")
        choice(d.label_subtokens, ["first", "all", "copy"], "data.label_subtokens")
        if d.length_quantiles is not None:
            q = d.length_quantiles
            if (len(q) != 2 or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in q)
                    or not 0 <= q[0] <= q[1] <= 1):
                raise ConfigError(f"data.length_quantiles must be [low, high] with 0 <= low <= high <= 1, got {q!r}")
        choice(d.length_pool, ["pooled", "split"], "data.length_pool")
        pool = d.length_pool_files
        if pool is not None and (not pool or not all(isinstance(p, str) and p for p in
                                                     (pool if isinstance(pool, list) else [pool]))):
            raise ConfigError(f"data.length_pool_files must be a file or a non-empty list of files, got {pool!r}")
        # Room for content tokens: max_seq_len minus at most 4 special tokens; the overlap must
        # leave each window new tokens, or a long sentence's windows would never advance.
        if d.max_seq_len - 4 <= d.stride:
            raise ConfigError(f"data.stride ({d.stride}) must be < data.max_seq_len - 4 ({d.max_seq_len - 4})")
