"""`posbias explain attention`: where DyReF's start and end queries look (DyReF paper §7.2, Fig. 3).

For one question + context, the attention probabilities of every layer and head are stacked and
reduced by an element-wise max over layers and heads; the two query rows of that (2 + N) x (2 + N)
map (queries attending to the queries and to every token) are drawn as a labelled 2 x (2 + N) heat
map, with the predicted answer's tokens boxed in red (and a given gold answer's labels in bold).

Shape legend: L layers, H heads, S = N + 2 positions of the encoder input.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

from .. import devices  # called as devices.resolve_device: the tests' CPU rule replaces it there
from ..batching import move
from ..render import plot_text, pyplot
from ..checkpoint import load_checkpoint
from ..errors import ConfigError
from ..evaluation import eval_config
from ..outputs import output_folder
from ..utils import atomic_write_json
from .collate import collate
from .evaluate import predict_examples
from .examples import QAExample


def query_attention(model, batch: dict) -> np.ndarray:
    """(2, S) max over layers and heads of the queries' attention probabilities, eager attention."""
    encoder = model.encoder
    previous = encoder.config._attn_implementation
    encoder.set_attn_implementation("eager")  # sdpa returns no attention probabilities
    try:
        batch = move(batch, next(model.parameters()).device)
        kwargs = model.head.encoder_kwargs(encoder, model._inputs, batch)
        with torch.inference_mode():
            att = torch.stack(encoder(**kwargs, output_attentions=True).attentions)  # (L, b, H, S, S)
    finally:
        encoder.set_attn_implementation(previous)
    return att[:, 0].amax(dim=(0, 1))[:2].float().cpu().numpy()  # (2, S)


def _answer_tokens(offsets: np.ndarray, start: int, end: int) -> list[int]:
    """Window tokens whose character span overlaps [start, end)."""
    return [i for i, (a, b) in enumerate(offsets.tolist()) if a >= 0 and a < end and b > start]


def explain_attention(model_path, question: str, context: str, out_dir, answer: str | None = None,
                      device: str = "auto") -> dict:
    """Write attention.png and attention.json to `out_dir`; returns what the JSON holds. The model
    runs on `device` (`--device`: auto, cpu, cuda, cuda:N, mps)."""
    if not question.strip() or not context.strip():
        raise ConfigError("question and context must be non-empty")
    model, tokenizer, mcfg = load_checkpoint(model_path, task="qa")
    if model.head_name != "dynamic_query":
        raise ConfigError(f"{model_path}: head {model.head_name!r} has no queries to explain; "
                          "`explain attention` needs a dynamic_query (DyReF) checkpoint")
    model.to(devices.resolve_device(device, "--device")).eval()
    result = example_attention(model, tokenizer, mcfg, question, context, answer)
    with output_folder(out_dir, "explain --output-dir") as out:  # new, empty or ours; one writer
        png = out / "attention.png"
        _plot(result["attention"], result["tokens"], result["predicted_tokens"], result["gold_tokens"], png,
              f"Q: {question}  |  predicted: {result['answer']!r}" + (f"  |  gold: {answer!r}" if answer else ""))
        result = {**result, "attention": result["attention"].round(6).tolist(), "plot": str(Path(out_dir) / png.name)}
        atomic_write_json(out / "attention.json", result, indent=None)
    return result


def example_attention(model, tokenizer, mcfg, question: str, context: str, answer: str | None = None,
                      answer_start: int | None = None) -> dict:
    """The queries' attention map for one example (the window holding the predicted answer):
    {"tokens": ["[q_s]", "[q_e]", *window tokens], "attention": (2, 2 + N) array, "context_tokens",
    "predicted_tokens", "gold_tokens" (column indices), "answer", "gold", "window", ...}. The gold
    answer is found at `answer_start` (a character offset) or else at its first occurrence."""
    cfg = eval_config(mcfg, None)
    example = QAExample(id="q0", question=question, context=context)
    preds, nbest, _, feats, _ = predict_examples(model, tokenizer, cfg, [example], source="<command line>",
                                                 progress=False)
    best = next((c for c in nbest["q0"] if c["text"] == preds["q0"] and c["window"] >= 0), None)
    window = best["window"] if best else 0
    batch = collate(feats, [window], pad_id=tokenizer.pad_token_id, padding_side=tokenizer.padding_side)
    att = query_attention(model, batch)
    pad = int(batch["pad_left"][0])
    n = int(batch["attention_mask"][0].sum())
    att = np.concatenate([att[:, :2], att[:, 2 + pad: 2 + pad + n]], axis=1)  # drop padding columns
    tokens = ["[q_s]", "[q_e]"] + tokenizer.convert_ids_to_tokens(feats.input_ids[window].tolist())
    offsets = feats.offsets[window]
    predicted = (list(range(best["token_start"], best["token_end"] + 1)) if best else [])
    gold = []
    if answer:
        at = context.find(answer) if answer_start is None else answer_start
        if at < 0 or context[at: at + len(answer)] != answer:
            raise ConfigError(f"--answer {answer!r} does not occur in the context"
                              + (f" at character {answer_start}" if answer_start is not None else ""))
        gold = _answer_tokens(offsets, at, at + len(answer))
    return {"question": question, "answer": preds["q0"], "gold": answer, "window": int(window),
            "tokens": tokens, "attention": att, "predicted_tokens": [2 + i for i in predicted],
            "gold_tokens": [2 + i for i in gold],
            "context_tokens": [2 + i for i, (a, _) in enumerate(offsets.tolist()) if a >= 0],
            "rows": ["start query", "end query"], "reduction": "max over layers and heads"}


def _plot(att: np.ndarray, tokens: list[str], predicted: list[int], gold: list[int], path: Path, title: str) -> None:
    from matplotlib.patches import Rectangle  # matplotlib is loaded by `pyplot()` only when a plot is drawn

    plt = pyplot()

    s = att.shape[1]
    fig, ax = plt.subplots(figsize=(max(8.0, 0.16 * s + 1.5), 2.6))
    ax.grid(False)  # a heat map: the reports' grid lines would cross its cells
    im = ax.imshow(att, aspect="auto", cmap="viridis", vmin=0, vmax=float(att.max()) or 1.0)
    ax.set_yticks([0, 1], ["start query", "end query"], fontsize=8)
    ax.set_xticks(range(s), [plot_text(t) for t in tokens], rotation=90, fontsize=6)  # "$" is a token
    for i in predicted:
        ax.add_patch(Rectangle((i - 0.5, -0.5), 1, 2, fill=False, edgecolor="red", linewidth=1.2))
        ax.get_xticklabels()[i].set_color("red")
    for i in gold:  # gold tokens: bold green labels (bold red when also predicted)
        label = ax.get_xticklabels()[i]
        label.set_fontweight("bold")
        if i not in predicted:
            label.set_color("green")
    ax.set_title(plot_text(title[:160]), fontsize=8)
    fig.colorbar(im, ax=ax, fraction=0.02, pad=0.01)
    fig.tight_layout()
    tmp = path.with_name(path.name + ".tmp.png")
    fig.savefig(tmp, dpi=120)
    plt.close(fig)
    os.replace(tmp, path)
