"""The QA run config: its `data` and `decode` sections and their cross-field checks."""
from __future__ import annotations

from dataclasses import dataclass, field

from ..compat import AnyOf, marks
from ..config import DataConfig, ModelConfig, RunConfig, TrainConfig, _from_dict, bounded, choice
from ..errors import ConfigError
from ..registry import HEADS, LABEL_POLICIES
from . import labels as _labels  # noqa: F401  (register built-ins)


@dataclass
class QAModelConfig(ModelConfig):
    """The model section of a QA run: the shared keys, and the span softmax's default."""

    softmax_over_default: str | None = field(default=None, metadata=marks(neutral="context"))
    """`model.head_options.softmax_over` for the heads that take it (`dynamic_query`, `independent`)
    when the run does not set it: `all` (every real token, [CLS] and question included; DyReF Eq. 1)
    or `context` (the context, plus [CLS] for SQuAD v2; Random Padding Eq. 1-2). Empty: the head's
    own default, `all` for `dynamic_query` and `context` for every other head; the resolved config
    records it (so overriding `model.head` of an already resolved config keeps the old head's
    value). Configs saved before the key existed read `context` (`posbias.compat._v0_to_v1`), and
    the hash leaves it out at `context`: earlier DyReF checkpoints and recorded runs keep their
    context-only softmax and their config hash."""

    def __post_init__(self):
        # Resolved here, not at model build: the value of a new DyReF config (`all`) must enter the
        # hash, while every other head's (`context`, the saved-config value) leaves it unchanged.
        from .model import head_softmax_default  # loads torch: reading the keys of a config stays without it

        default = head_softmax_default(self.head)  # None: the head has no such option
        if self.softmax_over_default is None:
            self.softmax_over_default = default or "context"
        choice(self.softmax_over_default, ["context", "all"], "model.softmax_over_default")
        if default is None and self.softmax_over_default != "context":
            raise ConfigError(f"model.softmax_over_default: head {self.head!r} has no softmax_over option "
                              "(it normalises over the context)")


@dataclass
class QADataConfig(DataConfig, defaults={"max_seq_len": 384, "stride": 128}, old_names={"stride": "doc_stride"}):
    """The data section of a QA run: the shared keys (`posbias.config.DataConfig`; `stride` was
    `doc_stride` before config version 2), and the questions' own."""

    version: str = "auto"
    """`1` (every question answerable), `2` (SQuAD v2 null answers) or `auto` (from the train file)."""
    max_query_len: int = bounded(64, 1)
    """Questions longer than this many tokens are cut (and counted in the run summary)."""
    context_first: str = "auto"
    """`auto` puts the context first when the tokenizer pads on the left (XLNet style), else `false`/`true`."""
    label_policy: str = "first"
    """Which gold mention becomes the training label (see `posbias.registry.LABEL_POLICIES`)."""
    unanswerable_windows: str = "cls"
    """Training windows that do not contain the label (every window of a question without one
    included): `cls` labels them [CLS] and keeps them, for SQuAD v1 as for v2 (BERT's original
    pre-processing, which the Random Padding paper follows, §2.2 and App. B.2; [CLS] then joins
    the training softmax, and a v1 model still answers with a context span); `drop` leaves them
    out; `auto` (the earlier default, kept in saved configs) = `cls` for v2, `drop` for v1."""


@dataclass
class DecodeConfig:
    """The decode section of a QA run: how start and end scores become answers."""

    n_best: int = bounded(20, 1)
    """Candidate answers kept per question (nbest.json)."""
    max_answer_len: int = bounded(30, 1)
    """Longest answer in tokens: end <= start + max_answer_len - 1."""
    null_threshold: float = bounded(0.0)  # any finite score difference
    """Version 2: predict "" when null score - best span score > threshold."""
    require_max_context: bool = False
    """Only let a window propose spans whose start token has its maximum context in that window
    (original BERT); the Hugging Face examples do not."""


@dataclass
class DebiasConfig:
    """`train.debias`: a de-biasing training objective for the span heads with start and end
    distributions (Ko et al., "Look at the First Sentence", §5; `posbias.qa.debias`). Training only:
    evaluation and prediction use the main model alone."""

    method: str | None = None
    """`bias_product`, `learned_mixin`, `learned_mixin_h` (Clark et al., 2019, with the answer-position
    prior of the training windows as the bias model) or `entropy` (Ko et al.'s entropy regularisation,
    of the cosine similarity between each token's word embedding and its last hidden state)."""
    entropy_weight: float | None = bounded(None, 0, 1e6)  # the authors use 8; 1e6 leaves the task loss no say
    """`entropy`: λ in L - λ·H (default 8, the authors' code); `learned_mixin_h`: Clark et al.'s w in
    L + w·H(softmax(g(x) log b)) (required). Other methods take none."""
    smoothing: float = bounded(1.0, 0, lo_open=True)  # > 0: no position may have probability 0
    """α of the prior's add-α smoothing: p = (count + α) / (windows + α (data.max_seq_len + 1)), so
    no position has probability 0."""
    gate: str | None = None
    """learned-mixin's g(x) = softplus(w·h): `cls` (default; h the [CLS] state) or `max` (the
    maximum of w·h_t over the real tokens, as the authors' code)."""
    gate_bias: bool | None = field(default=None, metadata=marks(neutral=AnyOf(None, True)))
    """learned-mixin's gate with a bias term c, softplus(w·h + c): false by default (filled in for
    learned_mixin(_h); other methods take none), as Clark et al. (2019) and Ko et al.'s code. Runs
    and checkpoints from before config version 3 had one: `compat._v2_to_v3` sets it true for them,
    and true is left out of the hash, so they keep their hashes."""
    prior: str = field(default="token", metadata=marks(neutral="token", omit=True))
    """The bias model of bias_product and learned-mixin(+H): `token` (P(label = j-th context token of
    the window)) or `sentence` (P(label in the k-th sentence of the context), every token of sentence
    k getting sentence k's value: Ko et al.'s `answer_stat`; `posbias.qa.debias`). Left out of the
    saved config and its hash at `token`, so runs set before the key existed keep theirs."""
    bias_term: str = field(default="log", metadata=marks(neutral="log", omit=True))
    """What bias_product and learned-mixin(+H) add to the main model's log-softmax: `log` (log b,
    Clark et al.'s product of experts) or `probability` (b itself, as the authors' code adds its
    statistics: `start_logits + start_bias` in `BertForQuestionAnsweringAllSentProd`). Left out of the
    saved config and its hash at `log`."""


@dataclass
class QATrainConfig(TrainConfig):
    """The train section of a QA run: the shared keys and `debias`."""

    debias: DebiasConfig | None = field(default=None, metadata=marks(neutral=None, omit=True))
    """De-biasing objective (see DebiasConfig), e.g. {method: learned_mixin}; absent or null: off.
    Left out of the saved config and its hash when off."""

    def __post_init__(self):
        if self.debias is not None and not isinstance(self.debias, DebiasConfig):
            self.debias = _from_dict(DebiasConfig, self.debias, "train.debias.")


@dataclass
class QAConfig(RunConfig):
    """An extractive QA run: `posbias train qa`."""

    task: str = "qa"
    """The task this config is for: `qa` (`posbias train qa`)."""
    model: QAModelConfig = field(default_factory=QAModelConfig)
    data: QADataConfig = field(default_factory=QADataConfig)
    train: QATrainConfig = field(default_factory=QATrainConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)
    perturb: list = field(default_factory=list)
    """Training-time input perturbations, each `{name: ..., options...}`."""

    def validate(self) -> None:
        """QA checks; each error names the dotted key(s) to change."""
        from .debias import check_config  # loads torch: reading the keys of a config stays without it
        from .model import make_head

        d = self.data
        if self.model.head is None:
            self.model.head = "independent"
        HEADS.get(self.model.head, "model.head")

        # The head's options are checked now (on a throwaway 8-wide head), not after the encoder loads.
        make_head(self.model.head, 8, d.version.startswith("2"), self.model.head_options)
        if self.train.debias is not None:
            check_config(self.train.debias, self.model.head)
        LABEL_POLICIES.get(d.label_policy, "data.label_policy")
        choice(d.version, ["auto", "1", "2", "1.1", "2.0"], "data.version")
        choice(d.context_first, ["auto", "true", "false"], "data.context_first")
        choice(d.unanswerable_windows, ["cls", "drop", "auto"], "data.unanswerable_windows")
        # A window holds [CLS] q [SEP] c [SEP] (4 specials for RoBERTa-style pairs): the context part
        # must be longer than the stride or the tokenizer cannot make progress.
        room = d.max_seq_len - d.max_query_len - 4
        if room <= d.stride:
            raise ConfigError(
                f"data.stride ({d.stride}) must be < data.max_seq_len - data.max_query_len - 4 "
                f"({room}): each window needs context tokens beyond the overlap")


def data_version(cfg: "QAConfig", has_impossible: bool) -> int:
    """1 or 2: `data.version`, or for `auto` whether the training data has null answers."""
    if cfg.data.version == "auto":
        return 2 if has_impossible else 1
    return 2 if cfg.data.version.startswith("2") else 1


