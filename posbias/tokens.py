"""What every task and perturbation reads off a tokenizer, never a hard-coded id: the special tokens
around one sequence, the separator that joins sentences, and the label id that carries no loss."""
from __future__ import annotations

from .errors import ConfigError

IGNORE = -100  # label id that carries no loss (torch's cross_entropy ignore_index)


def special_tokens(tokenizer) -> tuple[list[int], list[int]]:
    """(prefix, suffix) special token ids the tokenizer puts around one sequence, read off the
    tokenizer itself (no hard-coded ids): BERT [CLS] .. [SEP], RoBERTa <s> .. </s>, GPT-2 none."""
    with_sp = tokenizer(["a"], is_split_into_words=True)["input_ids"]
    without = tokenizer(["a"], is_split_into_words=True, add_special_tokens=False)["input_ids"]
    for i in range(len(with_sp) - len(without) + 1):
        if with_sp[i:i + len(without)] == without:
            return list(with_sp[:i]), list(with_sp[i + len(without):])
    raise ConfigError(f"cannot tell the special tokens of {type(tokenizer).__name__} apart from the text")


def separator_id(tokenizer) -> int:
    """The token that joins sentences in one input (duplicated test sets, Context Perturbation):
    the tokenizer's own separator ([SEP] for BERT, </s> for RoBERTa), else its end-of-sequence
    token (GPT-2, BLOOM); never a hard-coded id."""
    for name in ("sep_token_id", "eos_token_id"):
        value = getattr(tokenizer, name, None)
        if value is not None:
            return int(value)
    raise ConfigError(f"{type(tokenizer).__name__} has neither a separator nor an end-of-sequence token to join "
                      "sentences with")
