"""Scoring a causal LM's answers to prompts, two ways, both batched by length.

- **Log-likelihood** (`answer_logprobs`): the mean log-probability per token of the gold answer
  right after the prompt, from one forward pass per prompt and no generation. It works for base
  models, which rarely stop where an instruction-tuned model would, and it is a continuous score, so
  a few hundred questions already separate positions. Only the logits that predict the answer's
  tokens are computed (`logits_to_keep`: the last `max answer + 1` positions of a left-padded batch),
  which on a 262k-token vocabulary is most of a small model's head cost.
- **Greedy generation** (`generate_answers`): the model's own answer, decoded greedily up to
  `max_new_tokens` and cut at its first line break, then scored as Liu et al. score it (any
  normalised gold answer inside the normalised output, `benchmark.best_subspan_em`) and with SQuAD
  exact match and F1 of that first line (`posbias.qa.metrics`).

Prompts are token ids built once (`encode_prompts`), so each scoring, mitigation and position reuses
them. Batches hold prompts of similar length (sorted, then cut by a token budget), padded on the
left so that every row ends at the same column: the answer's logits sit at the same offsets in every
row and generation appends at the end of every row. Position ids are counted from each row's first
real token, so a padded row sees the positions an unpadded one would. The prompts share only Liu et
al.'s instruction (about 30 tokens of 800 at k = 5), so computing that prefix once would save under 5%
of a forward pass; every prompt is computed whole.

Shape legend: b prompts in a batch, s sequence (padded), a answer tokens kept, v vocabulary.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from ..errors import ConfigError
from . import BATCH_TOKENS
from ..qa.metrics import exact_match, f1

MAX_BATCH_TOKENS = BATCH_TOKENS  # the default's one home: posbias.generation


@dataclass
class Encoded:
    """A prompt and its gold answer as token ids: `prompt` (with the model's leading special tokens,
    or the chat template's), `answer` (the first gold answer, with its leading space, no special tokens)."""

    prompt: list[int]
    answer: list[int]
    text: str = ""
    """The prompt as the model reads it (after any chat template), for a server that takes text only."""
    answer_text: str = ""
    """The answer as it follows the prompt (" Gustave Eiffel")."""


def render(tokenizer, text: str, chat: bool) -> str:
    """The text the model reads: the prompt itself, or, with `chat`, the prompt as one user message in
    the tokenizer's chat template followed by the template's generation prompt."""
    if not chat:
        return text
    return tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                         add_generation_prompt=True)


def encode_prompts(tokenizer, prompts: Sequence[str], answers: Sequence[str], *, chat: bool = False) -> list[Encoded]:
    """Token ids of each prompt and its gold answer. The answer is tokenized on its own, after a space
    (" Gustave Eiffel"), as it would follow "Answer:"; under a chat template it follows the
    generation prompt with no space. A chat template writes its own leading special tokens, so the
    tokenizer adds none then."""
    empty = [a for a in answers if not a.strip()]
    if empty:
        raise ValueError(f"the gold answer {empty[0]!r} has no tokens")
    texts = [render(tokenizer, p, chat) for p in prompts]
    ids = tokenizer(texts, add_special_tokens=not chat, verbose=False)["input_ids"]
    lead = "" if chat else " "
    ans = tokenizer([lead + a.strip() for a in answers], add_special_tokens=False, verbose=False)["input_ids"]
    for a, text in zip(ans, answers):
        if not a:
            raise ValueError(f"the gold answer {text!r} has no tokens")
    return [Encoded(list(p), list(a), t, lead + x.strip()) for p, a, t, x in zip(ids, ans, texts, answers)]


def length_batches(lengths: Sequence[int], batch_size: int, max_tokens: int = MAX_BATCH_TOKENS) -> list[list[int]]:
    """Indices of `lengths` in batches of similar length (longest first, so the first batch shows the
    peak memory), each at most `batch_size` rows and `max_tokens` padded tokens (a single longer row
    still gets a batch of its own)."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batches, cur = [], []
    for i in order:
        width = lengths[cur[0]] if cur else lengths[i]  # the batch's longest row sets its width
        if cur and (len(cur) >= batch_size or width * (len(cur) + 1) > max_tokens):
            batches.append(cur)
            cur = []
        cur.append(i)
    if cur:
        batches.append(cur)
    return batches


def left_pad(rows: Sequence[Sequence[int]], pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask, position_ids), each (b, s), rows padded on the left; a row's
    positions count from its first real token (0, 1, ...), pads get position 0 (masked anyway)."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, width - len(r):] = torch.tensor(r, dtype=torch.long)
        mask[i, width - len(r):] = 1
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    return ids.to(device), mask.to(device), pos.to(device)


def check_finite(logits: torch.Tensor, source: str) -> None:
    """Refuse NaN or +inf logits (a bf16 overflow, a broken model) rather than score them: one line
    naming the model."""
    if torch.isnan(logits).any() or torch.isposinf(logits).any():
        raise ConfigError(f"{source}: the model's logits are NaN or infinite; posbias does not score them "
                          "(for a bf16/fp16 overflow, try --precision fp32)")


class FiniteLogits:
    """A `generate` logits processor that refuses NaN or +inf logits at any step (`check_finite`):
    greedy decoding would otherwise pick token 0 and score every answer as empty."""

    def __init__(self, source: str):
        self.source = source

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        check_finite(scores, self.source)
        return scores


@torch.inference_mode()
def answer_logprobs(model, encoded: Sequence[Encoded], *, pad_id: int, device, batch_size: int = 8,
                    max_tokens: int = MAX_BATCH_TOKENS, source: str = "model", progress: Callable | None = None,
                    before: Callable | None = None) -> np.ndarray:
    """(n,) mean log-probability per gold answer token, given its prompt (module docstring).

    `before(last_prompt)`, when given, is called before each batch's forward with the (b,) column of
    each row's last prompt token: Ms-PoE orders its heads there, where generation would."""
    out = np.empty(len(encoded), dtype=np.float64)
    lengths = [len(e.prompt) + len(e.answer) for e in encoded]
    for batch in length_batches(lengths, batch_size, max_tokens):
        rows = [encoded[i].prompt + encoded[i].answer for i in batch]
        ids, mask, pos = left_pad(rows, pad_id, device)
        keep = max(len(encoded[i].answer) for i in batch) + 1
        if before is not None:
            before(torch.tensor([ids.shape[1] - 1 - len(encoded[i].answer) for i in batch], device=ids.device))
        logits = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False,
                       logits_to_keep=keep).logits  # (b, keep, v): the last `keep` positions
        check_finite(logits, source)
        # in float32 at least (a bf16 model's logits), float64 kept (the tests' exact computations)
        logp = torch.log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), dim=-1)
        for j, i in enumerate(batch):
            a = encoded[i].answer
            # position t predicts token t + 1: the answer's tokens are predicted by the `len(a)` positions
            # before the last one (the last predicts past the answer)
            pred = logp[j, keep - 1 - len(a):keep - 1]  # (a, v)
            out[i] = float(pred.gather(1, torch.tensor(a, device=pred.device)[:, None]).mean())
        if progress is not None:
            progress(len(batch))
    return out


@torch.inference_mode()
def generate_answers(model, tokenizer, encoded: Sequence[Encoded], *, pad_id: int, device, batch_size: int = 8,
                     max_new_tokens: int = 32, max_tokens: int = MAX_BATCH_TOKENS, source: str = "model",
                     progress: Callable | None = None) -> list[str]:
    """Each prompt's greedy answer, its first line, stripped (module docstring)."""
    out: list[str] = [""] * len(encoded)
    eos = tokenizer.eos_token_id
    for batch in length_batches([len(encoded[i].prompt) for i in range(len(encoded))], batch_size, max_tokens):
        ids, mask, _ = left_pad([encoded[i].prompt for i in batch], pad_id, device)
        from transformers import LogitsProcessorList

        gen = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False,
                             num_beams=1, pad_token_id=pad_id, eos_token_id=eos, stop_strings=["\n"],
                             tokenizer=tokenizer, temperature=None, top_p=None, top_k=None,
                             logits_processor=LogitsProcessorList([FiniteLogits(source)]))
        texts = tokenizer.batch_decode(gen[:, ids.shape[1]:], skip_special_tokens=True)
        for j, i in enumerate(batch):
            out[i] = first_line(texts[j])
        if progress is not None:
            progress(len(batch))
    return out


def first_line(text: str) -> str:
    """The answer a generation gives: its first non-empty line, stripped."""
    for line in text.strip().splitlines():
        if line.strip():
            return line.strip()
    return ""


def squad_scores(prediction: str, answers: Sequence[str]) -> tuple[float, float]:
    """SQuAD v1.1 exact match and F1 of `prediction` against the best gold answer, in points."""
    return (100.0 * max(exact_match(prediction, a) for a in answers),
            100.0 * max(f1(prediction, a) for a in answers))


class Rate:
    """Counts prompts scored and the seconds they took (seconds per prompt in the report)."""

    def __init__(self):
        self.n, self.t0 = 0, time.perf_counter()

    def __call__(self, k: int) -> None:
        self.n += k

    @property
    def seconds(self) -> float:
        return time.perf_counter() - self.t0
