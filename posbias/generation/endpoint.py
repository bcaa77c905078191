"""A causal LM behind an HTTP server, scored like one in posbias's own process: the OpenAI-compatible
completions API that vLLM, llama.cpp's server, TGI, Ollama, `transformers serve` and hosted APIs speak.

What the diagnosis needs, and where a server has it (probed once, before any scoring):
- **Greedy generation**: `POST /v1/completions` with temperature 0, `max_tokens` and `stop ["\\n"]`
  (the in-process path stops at a line break too). Where a server's defaults would still sample or
  penalise, its own settings are added (`GREEDY`): llama.cpp applies `repeat_penalty` and DRY before
  its greedy pick, vLLM `repetition_penalty`.
- **The gold answer's log-likelihood**, through the first protocol the server answers (`LOGLIK`):
  1. `echo`: the OpenAI completions API's `echo` with `logprobs`, which returns every prompt token's
     log-probability (`choices[0].logprobs.token_logprobs`; vLLM, TGI's and several hosted APIs);
  2. `prompt_logprobs`: vLLM's extension (`choices[0].prompt_logprobs`, a {token id: {logprob}} per
     position);
  3. `forced`: llama.cpp's native `POST /completion`, whose OpenAI route ignores `echo`: one request per
     answer token, the prompt and the answer so far, `logit_bias` making the gold token the one chosen
     and `n_probs` reporting its log-probability from the raw logits (before any sampler, so the bias
     does not enter it). The answer's tokens go one after another to the slot holding the prompt in its
     cache, so each costs one token of compute.
  A server with none of them is refused before any work, naming `--scoring generation`.
- **Tokens**: the prompt budget counts tokens, and the prompts go to the server as token ids where it
  takes them (llama.cpp, vLLM; so the answer starts exactly where the budget said), else as text. The
  ids come from the server's own `/tokenize` (llama.cpp, vLLM) or from a local tokenizer the user names
  (`--tokenizer`); a local one is checked against the server on a sample of the real prompts (their ids
  through `/tokenize`, else the `usage.prompt_tokens` a completion reports).
- **Identity**: the score cache is keyed by what the server says it serves (`Server.identity`: the
  server, its URL, the model's name and what `/v1/models` and llama.cpp's `/props` report of it), so two
  servers' scores never share a cache; a server that comes back from a failure serving something else
  is refused.

Requests run `concurrency` at a time (threads: the work is the server's), each under a timeout, retried
with exponential backoff (and a server's `Retry-After`) on 408, 429, 5xx and refused, reset or timed-out
connections. When the retries run out the run ends in one line, and every score finished before that is
kept in the score cache, so the same command resumes. A key, when the server needs one, is read from
the environment variable the user names and sent as `Authorization: Bearer`; it is never written to a
log, a report, `run_info.json` or the cache, and a server message that repeats it is masked.
"""
from __future__ import annotations

import hashlib
import http.client
import ipaddress
import json
import math
import os
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field

from ..errors import ConfigError, ServerError
from ..limits import MIB, depth_over
from ..precision import Precision
from .scoring import Encoded, encode_prompts

MAX_RESPONSE = 64 * MIB
"""Bytes of one response at most (a 4,096-token prompt's `prompt_logprobs` is under 1 MB)."""
MAX_DEPTH = 32
"""Nesting levels of a response's JSON at most (real ones have under 8)."""
RETRY_STATUS = frozenset({408, 429, 500, 502, 503, 504})
LOGLIK = ("echo", "prompt_logprobs", "forced")
"""The log-likelihood protocols, in the order they are tried (module docstring)."""
GREEDY = {
    "llama.cpp": {"top_k": 1, "repeat_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0,
                  "dry_multiplier": 0.0, "cache_prompt": True},
    "vllm": {"repetition_penalty": 1.0, "top_k": -1},
    "openai-compatible": {},
}
"""Settings each server kind needs beside temperature 0 for its choice to be the argmax (module docstring)."""
FORCE_BIAS = 1e4
"""The logit bias that makes llama.cpp's sampler choose the gold token (`forced`)."""
PROBE_PROMPT, PROBE_ANSWER = "Question: What is the capital of France?\nAnswer:", " Paris"
CHECK_SAMPLE = 4
"""Real prompts on which a local tokenizer is checked against the server."""


class HTTPStatus(ServerError):
    """The server answered with an HTTP error status (`status`); its message, shortened, is in the text."""

    def __init__(self, message: str, status: int, retry_after: float | None = None):
        super().__init__(message)
        self.status, self.retry_after = status, retry_after


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect is an error: the key would follow it to another host, and urllib would follow it to ftp."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        raise HTTPStatus(f"{req.full_url} redirects to {newurl}; give the final URL as --endpoint", code)


def split_url(url: str, key: str = "--endpoint") -> tuple[str, str]:
    """(the server's root, its OpenAI base `<root>/v1`) of an http(s) URL given with or without `/v1`.
    Refused in one line: another scheme (file:, ftp:), no host, a user name or password, a query or a
    fragment (a key in the URL would be written wherever the URL is; use the environment variable)."""
    if not isinstance(url, str) or not url.strip():
        raise ConfigError(f"{key}: give the server's URL, e.g. http://127.0.0.1:8000/v1")
    parts = urllib.parse.urlsplit(url.strip())
    if parts.scheme not in ("http", "https"):
        raise ConfigError(f"{key}: {url!r} is not an http:// or https:// URL")
    if not parts.hostname:
        raise ConfigError(f"{key}: {url!r} names no host")
    if parts.username is not None or parts.password is not None or parts.query or parts.fragment:
        raise ConfigError(f"{key}: the URL must not carry a user name, password, query or fragment; pass a key with "
                          "--api-key-env NAME (an environment variable)")
    try:
        parts.port  # noqa: B018  (a port out of range raises here)
    except ValueError:
        raise ConfigError(f"{key}: {url!r} has an invalid port") from None
    root = urllib.parse.urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/"), "", ""))
    if root.endswith("/v1"):
        root = root[:-3]
    return root, root + "/v1"


def is_loopback(url: str) -> bool:
    host = urllib.parse.urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _message(raw: bytes) -> str:
    """A server's error body as one short line (OpenAI's error.message, FastAPI's detail, or the text)."""
    text = raw[:4096].decode("utf-8", errors="replace")
    try:
        obj = json.loads(text)
        if isinstance(obj, dict):
            err = obj.get("error", obj.get("detail", obj.get("message", text)))
            text = err.get("message", json.dumps(err)) if isinstance(err, dict) else str(err)
    except ValueError:
        pass
    return " ".join(text.split())[:300] or "(no message)"


class Client:
    """JSON over HTTP to one server, bounded and retried (module docstring). Thread-safe: each call
    opens its own connection."""

    def __init__(self, url: str, *, api_key: str | None = None, timeout: float = 300.0, retries: int = 4,
                 backoff: float = 1.0, key: str = "--endpoint"):
        self.root, self.api = split_url(url, key)
        self.timeout, self.retries, self.backoff = float(timeout), int(retries), float(backoff)
        self._key = api_key or None
        handlers = [_NoRedirect()]
        if is_loopback(self.root):  # a proxy from the environment would not reach the machine's own loopback
            handlers.append(urllib.request.ProxyHandler({}))
        self._opener = urllib.request.build_opener(*handlers)
        self.requests = 0
        self._count = threading.Lock()
        self.after_recovery: Callable[[], None] | None = None
        """Called when a request succeeds after failed tries: the server may have been restarted."""

    def _mask(self, text: str) -> str:
        return text.replace(self._key, "***") if self._key else text

    def get(self, path: str):
        return self.call("GET", path)

    def post(self, path: str, body: dict):
        return self.call("POST", path, body)

    def call(self, method: str, path: str, body: dict | None = None, retries: int | None = None):
        """The parsed JSON answer to `method` `<root><path>`; HTTPStatus for an error status that is not
        retried (or still failing after the retries), ServerError when the server cannot be reached."""
        url = self.root + path
        retries = self.retries if retries is None else retries
        for attempt in range(retries + 1):
            wait = self.backoff * 2 ** attempt
            try:
                out = self._once(method, url, body)
                if attempt and self.after_recovery is not None:
                    self.after_recovery()
                return out
            except HTTPStatus as e:
                if e.status not in RETRY_STATUS or attempt == retries:
                    raise
                wait = e.retry_after if e.retry_after is not None else wait
                last = f"HTTP {e.status}"
            except (urllib.error.URLError, http.client.HTTPException, ConnectionError, TimeoutError,
                    socket.timeout) as e:
                reason = getattr(e, "reason", e)
                last = " ".join(str(reason).split()) or type(reason).__name__
                if attempt == retries:
                    raise ServerError(self._mask(f"{url}: the server stopped answering ({last}) after {retries + 1} "
                                                 "tries")) from None
            time.sleep(min(wait, 60.0))
        raise AssertionError("unreachable")  # pragma: no cover

    def _once(self, method: str, url: str, body: dict | None):
        data = None if body is None else json.dumps(body).encode()
        headers = {"Accept": "application/json"}
        if data is not None:
            headers["Content-Type"] = "application/json"
        if self._key:
            headers["Authorization"] = f"Bearer {self._key}"
        req = urllib.request.Request(url, data=data, method=method, headers=headers)
        with self._count:
            self.requests += 1
        try:
            with self._opener.open(req, timeout=self.timeout) as resp:
                raw = resp.read(MAX_RESPONSE + 1)
        except urllib.error.HTTPError as e:
            retry = e.headers.get("Retry-After") if e.headers else None
            try:
                after = max(0.0, float(retry)) if retry is not None else None
            except ValueError:
                after = None
            try:
                raw = e.read(4096)
            except (OSError, http.client.HTTPException):
                raw = b""
            raise HTTPStatus(self._mask(f"{url}: HTTP {e.code}: {_message(raw)}"), e.code, after) from None
        if len(raw) > MAX_RESPONSE:
            raise ServerError(f"{url}: the answer is larger than {MAX_RESPONSE // MIB} MiB")
        try:
            obj = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError):
            raise ServerError(self._mask(f"{url}: the answer is not JSON ({_message(raw)[:80]})")) from None
        if depth_over(obj, MAX_DEPTH):
            raise ServerError(f"{url}: the answer's JSON is nested deeper than {MAX_DEPTH} levels")
        return obj


def _dig(obj, *path, default=None):
    """obj[path[0]][path[1]]..., or `default` where a step is missing or of the wrong type."""
    for p in path:
        if isinstance(p, int):
            if not isinstance(obj, list) or not -len(obj) <= p < len(obj):
                return default
        elif not isinstance(obj, dict) or p not in obj:
            return default
        obj = obj[p]
    return obj


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _positive_int(v) -> int | None:
    return int(v) if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None


# ---------------------------------------------------------------------------------------- the server
@dataclass
class Server:
    """What a server is and what it offers (`probe`)."""

    client: Client
    kind: str
    """llama.cpp, vllm or openai-compatible."""
    model: str
    entry: dict = field(default_factory=dict)
    """The model's entry in /v1/models."""
    props: dict = field(default_factory=dict)
    """llama.cpp's /props."""
    context_length: int | None = None
    """Tokens a request may hold (prompt and generated), as the server states it."""
    trained_context: int | None = None
    """The model's own context (llama.cpp's n_ctx_train), where stated."""
    parameters: int | None = None
    identity_extra: dict | None = None
    """What the owner of a started server knows of it (the GGUF's sha256), in place of its URL."""

    @property
    def tokenizes(self) -> bool:
        return self.kind in ("llama.cpp", "vllm")

    def identity(self) -> dict:
        """What the score cache is keyed by (module docstring)."""
        entry = {k: v for k, v in self.entry.items() if k not in ("created", "status")}
        out = {"server": self.kind, "model": self.model, "entry": entry}
        if self.kind == "llama.cpp":
            out["model_path"] = self.props.get("model_path")
        if self.identity_extra is not None:  # a started server: its port changes, its file does not
            out.update(self.identity_extra)
            out.pop("model_path", None)
            out["entry"] = {k: v for k, v in entry.items() if k not in ("id", "aliases")}
            out.pop("model", None)
        else:
            out["url"] = self.client.root
        return out

    def fingerprint(self) -> str:
        blob = json.dumps(self.identity(), sort_keys=True, separators=(",", ":"), default=str)
        return "served-" + hashlib.sha256(blob.encode()).hexdigest()[:16]


def probe(client: Client, model: str | None, identity_extra: dict | None = None) -> Server:
    """The server at `client`: its kind, the model to ask for, its context (module docstring).

    `model` None: the one model the server lists (refused in one line if it lists several or none)."""
    try:
        listed = client.get("/v1/models")
    except HTTPStatus as e:
        if model is None:
            raise ConfigError(f"--endpoint: {client.root} lists no models ({e}); name one with --model") from None
        listed = {}
    data = [m for m in (_dig(listed, "data") or []) if isinstance(m, dict) and isinstance(m.get("id"), str)]
    names = [m["id"] for m in data]
    if model is None:
        if len(names) != 1:
            raise ConfigError(f"--endpoint: {client.root} serves {len(names)} models ({', '.join(names[:10]) or 'none'}); "
                              "name one with --model")
        model = names[0]
    elif names and model not in names:
        aliases = {a: m["id"] for m in data for a in (m.get("aliases") or []) if isinstance(a, str)}
        if model not in aliases:
            raise ConfigError(f"--model: {client.root} does not serve {model!r}; it serves "
                              f"{', '.join(names[:10])}")
    entry = next((m for m in data if m["id"] == model or model in (m.get("aliases") or [])), {})
    props = _get_optional(client, "/props")
    if isinstance(props, dict) and isinstance(props.get("default_generation_settings"), dict):
        kind = "llama.cpp"
    elif entry.get("owned_by") == "vllm" or isinstance(_dig(_get_optional(client, "/version"), "version"), str) \
            and "max_model_len" in entry:
        kind = "vllm"
    else:
        kind, props = "openai-compatible", {}
    meta = entry.get("meta") if isinstance(entry.get("meta"), dict) else {}
    if kind == "llama.cpp":
        slot = _positive_int(_dig(props, "default_generation_settings", "n_ctx"))
        trained = _positive_int(meta.get("n_ctx_train"))
        context = slot
    else:
        context = _positive_int(entry.get("max_model_len")) or _positive_int(entry.get("context_length"))
        trained = context
    return Server(client, kind, model, entry, props if kind == "llama.cpp" else {}, context, trained,
                  _positive_int(meta.get("n_params")), identity_extra)


def _get_optional(client: Client, path: str):
    """GET `path`, or None where the server has no such route (one try: not a reason to wait); a
    refused key is not "no such route" and is raised."""
    try:
        return client.call("GET", path, retries=0)
    except HTTPStatus as e:
        if e.status in (401, 403):
            raise
        return None
    except ServerError:
        return None


# ------------------------------------------------------------------------------------- tokenization
class ServerTokenizer:
    """The server's `/tokenize` in the shape `encode_prompts` calls (`tokenizer(texts, add_special_tokens=)`)."""

    def __init__(self, server: Server, concurrency: int):
        self.server, self.concurrency = server, concurrency
        self.chat_template = None
        self.eos_token_id = self.pad_token_id = None

    def ids(self, text: str, add_special: bool) -> list[int]:
        s = self.server
        if s.kind == "llama.cpp":
            body = {"content": text, "add_special": add_special, "parse_special": True}
        else:  # vLLM
            body = {"model": s.model, "prompt": text, "add_special_tokens": add_special}
        tokens = _dig(s.client.post("/tokenize", body), "tokens")
        if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
            raise ServerError(f"{s.client.root}/tokenize: the answer holds no list of token ids")
        return tokens

    def __call__(self, texts, add_special_tokens: bool = True, verbose: bool = False) -> dict:
        single = isinstance(texts, str)
        texts = [texts] if single else list(texts)
        out = _parallel(lambda t: self.ids(t, add_special_tokens), texts, self.concurrency)
        return {"input_ids": out[0] if single else out}

    def apply_chat_template(self, *args, **kwargs):
        raise ConfigError("--chat: over an endpoint the prompt goes to /v1/completions as it is; to wrap it in the "
                          "model's chat template, name its tokenizer with --tokenizer")


def _parallel(fn: Callable, items: Sequence, workers: int, on_result: Callable | None = None) -> list:
    """[fn(x) for x in items] on `workers` threads, in order. On the first failure the rest is cancelled;
    `on_result(i, value)` has been called for every item finished before it."""
    out: list = [None] * len(items)
    if workers <= 1 or len(items) <= 1:
        for i, x in enumerate(items):
            out[i] = fn(x)
            if on_result is not None:
                on_result(i, out[i])
        return out
    pool = ThreadPoolExecutor(max_workers=min(workers, len(items)), thread_name_prefix="posbias-endpoint")
    try:
        futures = {pool.submit(fn, x): i for i, x in enumerate(items)}
        for f in as_completed(futures):
            i = futures[f]
            out[i] = f.result()  # the first failure propagates; `finally` cancels what has not started
            if on_result is not None:
                on_result(i, out[i])
        return out
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


class PartialScores(Exception):
    """Scoring stopped at `error`; `done` maps the index of each item finished before it to its score."""

    def __init__(self, done: dict, error: BaseException):
        super().__init__(str(error))
        self.done, self.error = done, error


# ------------------------------------------------------------------------------------------ the model
class ServedLM:
    """A model behind a server, with the members the diagnosis uses of `lm.LM` (module docstring)."""

    folder = "(served)"
    model = None  # no weights in this process: Ms-PoE cannot patch it

    def __init__(self, server: Server, *, source: str, kind: str, tokenizer=None, tokenizer_name: str | None = None,
                 concurrency: int = 4, owner=None):
        self.server, self.client = server, server.client
        self.source, self.kind, self.concurrency = source, kind, max(1, int(concurrency))
        self.local_tokenizer, self.tokenizer_name = tokenizer, tokenizer_name
        if tokenizer is None and not server.tokenizes:
            raise ConfigError(f"--tokenizer: {server.client.root} ({server.kind}) has no /tokenize, and the prompt budget "
                              "counts tokens: name the model's tokenizer (a Hugging Face folder or cached Hub id) "
                              "with --tokenizer")
        self.tokenizer = tokenizer if tokenizer is not None else ServerTokenizer(server, self.concurrency)
        self.chat_template = bool(getattr(tokenizer, "chat_template", None)) if tokenizer is not None else False
        self.owner = owner
        self.device = f"the server at {server.client.root}"
        self.precision = Precision("served", f"as {server.kind} computes it", "served")
        self.fingerprint = server.fingerprint()
        self.greedy = dict(GREEDY[server.kind])
        self.loglik_protocol: str | None = None
        self.tokenizer_check: str | None = None
        self.accepts_ids = server.kind in ("llama.cpp", "vllm")
        self._counts: dict[str, int] = {}
        self._lock = threading.Lock()
        self.client.after_recovery = self._same_server
        if not self.accepts_ids:
            self.accepts_ids = self._takes_ids()

    # ---- what the diagnosis reads of a model
    @property
    def context_length(self) -> int:
        s = self.server
        known = [n for n in (s.trained_context, s.context_length) if n]
        if known:
            return min(known)
        tok = getattr(self.local_tokenizer, "model_max_length", None)
        return int(tok) if isinstance(tok, int) and 0 < tok < 10**8 else 4096

    @property
    def parameters(self) -> int | None:
        return self.server.parameters

    def count_tokens(self, text: str) -> int:
        """Tokens of `text` without special tokens (remembered: the documents are counted once)."""
        with self._lock:
            n = self._counts.get(text)
        if n is None:
            n = len(self.tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"])
            with self._lock:
                self._counts[text] = n
        return n

    def encode(self, texts: list[str], answers: list[str], chat: bool) -> list[Encoded]:
        return encode_prompts(self.tokenizer, texts, answers, chat=chat)

    def describe(self) -> dict:
        s = self.server
        return {"model": self.source, "folder": self.folder, "kind": self.kind, "device": self.device,
                "precision": self.precision.to_dict(), "context_length": self.context_length,
                "parameters": self.parameters, "chat_template": self.chat_template, "fingerprint": self.fingerprint,
                "server": {"kind": s.kind, "url": s.client.root, "model": s.model, "identity": s.identity(),
                           "loglik_protocol": self.loglik_protocol, "greedy_settings": {"temperature": 0, **self.greedy},
                           "prompts_as": "token ids" if self.accepts_ids else "text",
                           "tokenizer": self.tokenizer_name or f"the server's /tokenize",
                           "tokenizer_check": self.tokenizer_check, "concurrency": self.concurrency,
                           "requests": self.client.requests,
                           "started_by_posbias": None if self.owner is None else {
                               "pid": self.owner.pid, "threads": self.owner.threads,
                               "slot_tokens": self.owner.slot_tokens, "slots": self.owner.parallel}}}

    def close(self) -> None:
        if self.owner is not None:
            self.owner.stop()

    # ---- probes
    def _takes_ids(self) -> bool:
        """Whether /v1/completions takes a prompt of token ids (the OpenAI API does; transformers serve does not)."""
        ids = self.tokenizer("Hello", add_special_tokens=False, verbose=False)["input_ids"]
        try:
            self._completion({"prompt": ids, "max_tokens": 1}, retries=0)
            return True
        except HTTPStatus as e:
            if 400 <= e.status < 500 and e.status not in (401, 403, 429):
                return False
            raise

    def probe_loglik(self) -> str:
        """The first log-likelihood protocol the server answers (module docstring), or one line naming
        `--scoring generation`."""
        enc = self.encode([PROBE_PROMPT], [PROBE_ANSWER.strip()], chat=False)[0]
        for proto in LOGLIK:
            if proto == "forced" and self.server.kind != "llama.cpp":
                continue
            if proto != "echo" and not self.accepts_ids:
                continue
            try:
                value = self._loglik_one(enc, proto)
            except (HTTPStatus, _Unsupported) as e:
                if isinstance(e, HTTPStatus) and e.status in (401, 403):
                    raise
                continue
            if _finite(value):
                self.loglik_protocol = proto
                return proto
        raise ConfigError(f"--scoring loglik: {self.client.root} ({self.server.kind}) returns no prompt "
                          "log-probabilities (echo with logprobs, vLLM's prompt_logprobs) nor forced-token scores "
                          "(llama.cpp's /completion); use --scoring generation")

    def check_tokenizer(self, texts: list[str], chat: bool = False) -> str:
        """A local tokenizer against the server on `texts` (real prompts): their ids through the server's
        /tokenize, else the prompt token count a completion reports. Refused in one line when they differ."""
        if self.local_tokenizer is None:
            self.tokenizer_check = "the server's own /tokenize"
            return self.tokenizer_check
        sample = texts[:CHECK_SAMPLE]
        ours = self.local_tokenizer(sample, add_special_tokens=not chat, verbose=False)["input_ids"]
        if self.server.tokenizes:
            theirs = ServerTokenizer(self.server, self.concurrency)(sample, add_special_tokens=not chat)["input_ids"]
            for i, (a, b) in enumerate(zip(ours, theirs)):
                if list(a) != list(b):
                    at = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
                    raise ConfigError(f"--tokenizer: {self.tokenizer_name} and the server's /tokenize differ on sample "
                                      f"prompt {i + 1} at token {at} ({len(a)} vs {len(b)} tokens): it is not the "
                                      "served model's tokenizer")
            self.tokenizer_check = f"ids equal to the server's /tokenize on {len(sample)} of {len(sample)} sample prompts"
            return self.tokenizer_check
        counts = []
        for i, t in enumerate(sample):
            ans = self._completion({"prompt": t, "max_tokens": 1})
            n = _positive_int(_dig(ans, "usage", "prompt_tokens"))
            if n is None:
                self.tokenizer_check = "not checked: the server has no /tokenize and reports no usage.prompt_tokens"
                return self.tokenizer_check
            if n != len(ours[i]):
                raise ConfigError(f"--tokenizer: {self.tokenizer_name} counts {len(ours[i])} tokens in sample prompt "
                                  f"{i + 1}, the server {n}: it is not the served model's tokenizer")
            counts.append(n)
        self.tokenizer_check = (f"token counts equal to the server's usage.prompt_tokens on {len(counts)} of "
                                f"{len(sample)} sample prompts")
        return self.tokenizer_check

    # ---- scoring
    def _completion(self, body: dict, retries: int | None = None) -> dict:
        full = {"model": self.server.model, "temperature": 0, **self.greedy, **body}
        return self.client.call("POST", "/v1/completions", full, retries=retries)

    def _prompt(self, e: Encoded, with_answer: bool):
        if self.accepts_ids:
            return e.prompt + e.answer if with_answer else e.prompt
        return e.text + e.answer_text if with_answer else e.text

    def _loglik_one(self, e: Encoded, proto: str) -> float:
        root = self.client.root
        if proto == "forced":
            total = 0.0
            for t, tok in enumerate(e.answer):
                ans = self.client.post("/completion", {
                    "prompt": e.prompt + e.answer[:t], "n_predict": 1, "n_probs": 1, "temperature": 0,
                    "logit_bias": [[tok, FORCE_BIAS]], "cache_prompt": True, "post_sampling_probs": False,
                    "return_tokens": True})
                got = _dig(ans, "completion_probabilities", 0)
                if _dig(got, "id") != tok or not _finite(_dig(got, "logprob")):
                    raise _Unsupported(f"{root}/completion did not report the forced token's log-probability")
                total += float(got["logprob"])
            return total / len(e.answer)
        if proto == "prompt_logprobs":
            ans = self._completion({"prompt": self._prompt(e, True), "max_tokens": 1, "prompt_logprobs": 1})
            rows = _dig(ans, "choices", 0, "prompt_logprobs")
            n = len(e.prompt)
            if not isinstance(rows, list) or len(rows) < n + len(e.answer):
                raise _Unsupported(f"{root}/v1/completions returned no prompt_logprobs")
            vals = [_dig(rows[n + t], str(tok), "logprob") for t, tok in enumerate(e.answer)]
            if not all(_finite(v) for v in vals):
                raise _Unsupported(f"{root}/v1/completions: prompt_logprobs lacks the answer's tokens")
            return sum(vals) / len(vals)
        ans = self._completion({"prompt": self._prompt(e, True), "max_tokens": 1, "echo": True, "logprobs": 1})
        lp = _dig(ans, "choices", 0, "logprobs")
        values = _dig(lp, "token_logprobs")
        if not isinstance(values, list):
            raise _Unsupported(f"{root}/v1/completions does not echo the prompt's log-probabilities")
        if self.accepts_ids:
            n = len(e.prompt)
            vals = values[n:n + len(e.answer)]
            if len(values) < n + len(e.answer):
                raise _Unsupported(f"{root}/v1/completions echoed {len(values)} log-probabilities for "
                                   f"{n + len(e.answer)} prompt tokens")
        else:  # a text prompt: the answer's tokens are those the server placed at or after its first character
            offsets = _dig(lp, "text_offset")
            end = len(e.text) + len(e.answer_text)
            if not isinstance(offsets, list) or len(offsets) != len(values):
                raise _Unsupported(f"{root}/v1/completions echoes no text offsets")
            vals = [v for o, v in zip(offsets, values) if isinstance(o, int) and len(e.text) <= o < end]
        if not vals or not all(_finite(v) for v in vals):
            raise _Unsupported(f"{root}/v1/completions echoed no log-probability for the answer")
        return sum(vals) / len(vals)

    def loglik(self, encoded: Sequence[Encoded], *, before=None, **_batching) -> list[float]:
        """Each prompt's mean log-probability per gold answer token, through `probe_loglik`'s protocol.
        PartialScores when the server fails part way (the finished scores in it)."""
        if before is not None:
            raise ConfigError("--mitigation mspoe needs the model in posbias's own process, not behind a server")
        proto = self.loglik_protocol or self.probe_loglik()
        return self._run(lambda e: self._checked(self._loglik_one(e, proto), e), encoded)

    def _checked(self, value: float, e: Encoded) -> float:
        if not _finite(value) or value > 1e-6:
            raise ServerError(f"{self.client.root}: a log-probability of {value!r} for a prompt of {len(e.prompt)} "
                              "tokens (not a finite number <= 0)")
        return float(value)

    def generate(self, encoded: Sequence[Encoded], *, max_new_tokens: int = 32, **_batching) -> list[str]:
        """Each prompt's greedy answer, its first line, stripped (as `scoring.generate_answers`)."""
        from .scoring import first_line

        def one(e: Encoded) -> str:
            ans = self._completion({"prompt": self._prompt(e, False), "max_tokens": max_new_tokens, "stop": ["\n"]})
            text = _dig(ans, "choices", 0, "text")
            if not isinstance(text, str):
                raise ServerError(f"{self.client.root}/v1/completions: the answer holds no choices[0].text")
            return first_line(text)

        return self._run(one, encoded)

    def _run(self, fn: Callable, encoded: Sequence[Encoded]) -> list:
        done: dict[int, object] = {}
        try:
            return _parallel(fn, list(encoded), self.concurrency, on_result=done.__setitem__)
        except ServerError as e:
            raise PartialScores(dict(done), e) from None

    def _same_server(self) -> None:
        """After a request got through on a retry (the server may have restarted): refuse a server that
        now reports another identity, so that two models' scores never meet in one cache or report."""
        try:
            now = probe(Client(self.client.root, api_key=self.client._key, timeout=30, retries=2),
                        self.server.model, self.server.identity_extra)
        except ConfigError as e:
            now, why = None, str(e).split(": ", 1)[-1]
        else:
            why = "its /v1/models or /props changed"
        if now is None or now.fingerprint() != self.fingerprint:
            raise ServerError(f"{self.client.root} came back from a failure serving another model than when this run "
                              f"started ({why}); its scores are not mixed with the earlier ones: check the server, "
                              "then run again")


class _Unsupported(Exception):
    """A protocol the server does not offer (its answer lacks what the protocol reads)."""


def api_key(env: str | None) -> str | None:
    """The key in the environment variable `env` (None: no key). Its value is never printed."""
    if env is None:
        return None
    if not env or not env.replace("_", "").isalnum():
        raise ConfigError(f"--api-key-env: {env!r} is not an environment variable's name")
    value = os.environ.get(env)
    if not value:
        raise ConfigError(f"--api-key-env: the environment variable {env} is not set or empty")
    if any(c in value for c in "\r\n"):
        raise ConfigError(f"--api-key-env: the value of {env} holds a line break")
    return value.strip()
