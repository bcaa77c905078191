"""posbias/generation/endpoint.py without a model server: URLs, keys, the client's retries and bounds
(against a scripted HTTP handler in this process: what real servers do only when they fail), and the
parsing of vLLM's documented log-probability answers, which no server here produces (their shapes are
quoted from vLLM's OpenAI-compatible server documentation)."""
from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from posbias.errors import ConfigError, ServerError
from posbias.generation import backend as Bk
from posbias.generation import endpoint as E
from posbias.generation.llama_server import check_server_args
from posbias.generation.scoring import Encoded


@pytest.mark.parametrize("url, root", [("http://127.0.0.1:8000/v1", "http://127.0.0.1:8000"),
                                        ("http://127.0.0.1:8000/v1/", "http://127.0.0.1:8000"),
                                        ("http://127.0.0.1:8000", "http://127.0.0.1:8000"),
                                        ("https://api.example.com/inference/v1", "https://api.example.com/inference")])
def test_a_base_url_with_or_without_v1_gives_the_servers_root(url, root):
    assert E.split_url(url) == (root, root + "/v1")


@pytest.mark.parametrize("url, message", [("file:///etc/passwd", "not an http"), ("ftp://host/x", "not an http"),
                                           ("http://user:pw@host/v1", "user name, password"),
                                           ("http://host/v1?key=abc", "query"), ("http:///v1", "names no host"),
                                           ("http://host:99999/v1", "invalid port"), ("", "give the server's URL")])
def test_a_url_posbias_will_not_send_to_is_one_line(url, message):
    with pytest.raises(ConfigError, match=message) as e:
        E.split_url(url)
    assert "\n" not in str(e.value)


def test_the_key_comes_from_the_named_variable_and_is_never_in_a_message(monkeypatch):
    monkeypatch.setenv("MY_KEY", "sk-secret-1")
    assert E.api_key("MY_KEY") == "sk-secret-1" and E.api_key(None) is None
    monkeypatch.delenv("MY_KEY")
    with pytest.raises(ConfigError, match="MY_KEY is not set"):
        E.api_key("MY_KEY")
    with pytest.raises(ConfigError, match="not an environment variable's name"):
        E.api_key("sk-secret-1")


class Script(BaseHTTPRequestHandler):
    """Answers each request with the next (status, headers, body) of `self.server.script`."""

    def _answer(self):
        self.server.seen.append((self.command, self.path, dict(self.headers),
                                 self.rfile.read(int(self.headers.get("Content-Length") or 0))))
        status, headers, body = self.server.script.pop(0)
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer

    def log_message(self, *args):
        pass


@pytest.fixture()
def scripted():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Script)
    srv.script, srv.seen = [], []
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv
    srv.shutdown()


def _url(srv):
    return f"http://127.0.0.1:{srv.server_address[1]}/v1"


def test_429_and_5xx_are_retried_with_backoff_and_retry_after(scripted):
    ok = json.dumps({"ok": 1}).encode()
    scripted.script = [(429, {"Retry-After": "0.2"}, b"{}"), (503, {}, b"{}"), (200, {}, ok)]
    c = E.Client(_url(scripted), backoff=0.05, retries=2)
    t0 = time.monotonic()
    assert c.post("/v1/completions", {"x": 1}) == {"ok": 1}
    assert time.monotonic() - t0 >= 0.2 + 0.1  # Retry-After, then 2 x backoff
    assert len(scripted.seen) == 3


def test_a_4xx_is_not_retried_and_its_message_is_one_line_without_the_key(scripted):
    scripted.script = [(400, {}, json.dumps({"error": {"message": "prompt too long for sk-abc\nsecond line"}}).encode())]
    c = E.Client(_url(scripted), api_key="sk-abc", backoff=0.01)
    with pytest.raises(E.HTTPStatus) as e:
        c.post("/v1/completions", {})
    assert e.value.status == 400 and "sk-abc" not in str(e.value) and "\n" not in str(e.value)
    assert "prompt too long for ***" in str(e.value)
    assert len(scripted.seen) == 1 and scripted.seen[0][2]["Authorization"] == "Bearer sk-abc"


def test_a_redirect_is_refused_so_the_key_never_follows_it(scripted):
    scripted.script = [(302, {"Location": "http://example.com/steal"}, b"")]
    with pytest.raises(ServerError, match="redirects to http://example.com/steal"):
        E.Client(_url(scripted), api_key="sk-abc").get("/v1/models")


def test_an_answer_over_the_bound_or_not_json_is_one_line(scripted, monkeypatch):
    monkeypatch.setattr(E, "MAX_RESPONSE", 1000)
    scripted.script = [(200, {}, b"[" + b"1," * 1000 + b"1]"), (200, {}, b"<html>oops</html>"),
                       (200, {}, b"[" * 40 + b"]" * 40)]
    c = E.Client(_url(scripted))
    with pytest.raises(ServerError, match="larger than"):
        c.get("/v1/models")
    with pytest.raises(ServerError, match="not JSON"):
        c.get("/v1/models")
    with pytest.raises(ServerError, match="nested deeper"):
        c.get("/v1/models")


def test_a_server_that_stays_down_ends_after_the_retries():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    c = E.Client(f"http://127.0.0.1:{port}", retries=2, backoff=0.01)
    with pytest.raises(ServerError, match="stopped answering .* after 3 tries"):
        c.get("/v1/models")


class FakeClient:
    """Returns the documented answer for each route; records the bodies."""

    def __init__(self, answers: dict):
        self.answers, self.bodies, self.root, self.requests, self._key = answers, [], "http://vllm:8000", 0, None
        self.after_recovery = None

    def call(self, method, path, body=None, retries=None):
        self.bodies.append((path, body))
        return self.answers[path](body) if callable(self.answers[path]) else self.answers[path]

    def post(self, path, body):
        return self.call("POST", path, body)


def _served(kind: str, answers: dict) -> E.ServedLM:
    server = E.Server(FakeClient(answers), kind, "m", {"id": "m"})
    lm = object.__new__(E.ServedLM)
    lm.server, lm.client, lm.accepts_ids, lm.greedy = server, server.client, True, dict(E.GREEDY[kind])
    return lm


ENC = Encoded([11, 12, 13], [21, 22], "prompt", " answer")


def test_echo_log_probabilities_are_read_at_the_answers_positions():
    # OpenAI completions with echo: token_logprobs covers the prompt (first None) and the generated token
    values = [None, -1.0, -2.0, -0.5, -1.5, -9.0]
    lm = _served("vllm", {"/v1/completions": {"choices": [{"text": "x", "logprobs": {
        "tokens": ["a"] * 6, "token_logprobs": values, "top_logprobs": None, "text_offset": list(range(6))}}]}})
    assert lm._loglik_one(ENC, "echo") == pytest.approx(-1.0)  # the answer's two: -0.5, -1.5
    body = lm.client.bodies[-1][1]
    assert body["prompt"] == [11, 12, 13, 21, 22] and body["echo"] is True and body["logprobs"] == 1
    assert body["temperature"] == 0 and body["repetition_penalty"] == 1.0


def test_vllm_prompt_logprobs_are_read_for_the_answers_own_tokens():
    # vLLM: choices[0].prompt_logprobs, None first, then {token id: {logprob, rank, decoded_token}} per position
    rows = [None, {"12": {"logprob": -1.0, "rank": 1, "decoded_token": "b"}},
            {"13": {"logprob": -2.0, "rank": 3, "decoded_token": "c"}},
            {"21": {"logprob": -0.25, "rank": 1, "decoded_token": " a"}, "7": {"logprob": -0.1, "rank": 1}},
            {"22": {"logprob": -0.75, "rank": 2, "decoded_token": "ns"}}]
    lm = _served("vllm", {"/v1/completions": {"choices": [{"text": "x", "prompt_logprobs": rows}]}})
    assert lm._loglik_one(ENC, "prompt_logprobs") == pytest.approx(-0.5)
    assert lm.client.bodies[-1][1]["prompt_logprobs"] == 1


def test_llama_cpp_forced_tokens_ask_once_per_answer_token_with_the_answer_so_far():
    def answer(body):
        tok = body["logit_bias"][0][0]
        return {"completion_probabilities": [{"id": tok, "logprob": -float(tok - 20), "top_logprobs": []}]}

    lm = _served("llama.cpp", {"/completion": answer})
    assert lm._loglik_one(ENC, "forced") == pytest.approx(-1.5)  # (-1 + -2) / 2
    prompts = [b["prompt"] for _, b in lm.client.bodies]
    assert prompts == [[11, 12, 13], [11, 12, 13, 21]] and all(b["n_probs"] == 1 for _, b in lm.client.bodies)


def test_an_answer_without_what_the_protocol_reads_is_unsupported_not_a_score():
    lm = _served("llama.cpp", {"/v1/completions": {"choices": [{"text": "x", "logprobs": {"content": []}}]},
                               "/completion": {"completion_probabilities": [{"id": 99, "logprob": -1.0}]}})
    for proto in ("echo", "prompt_logprobs", "forced"):
        with pytest.raises(E._Unsupported):
            lm._loglik_one(ENC, proto)


def test_ms_poe_and_a_backend_over_an_endpoint_are_refused_before_any_request():
    with pytest.raises(ConfigError, match="mspoe patches the model's attention"):
        Bk.check_backend_options(None, endpoint="http://127.0.0.1:1", backend="auto", needs_weights=True)
    with pytest.raises(ConfigError, match="with --endpoint the server is the backend"):
        Bk.check_backend_options(None, endpoint="http://127.0.0.1:1", backend="llama.cpp", needs_weights=False)
    with pytest.raises(ConfigError, match="--backend llama.cpp serves a GGUF file"):
        Bk.check_backend_options("some/folder", endpoint=None, backend="llama.cpp", needs_weights=False)
    with pytest.raises(ConfigError, match="give a model"):
        Bk.check_backend_options(None, endpoint=None, backend="auto", needs_weights=False)


def test_llama_server_args_may_not_set_what_posbias_owns():
    assert check_server_args('-ngl 99 --flash-attn on') == ["-ngl", "99", "--flash-attn", "on"]
    for bad in ("--port 9", "-m other.gguf", "--host=0.0.0.0", "-np 8", "--api-key k"):
        with pytest.raises(ConfigError, match="is set by posbias"):
            check_server_args(bad)
    with pytest.raises(ConfigError, match="--llama-server-args"):
        check_server_args('"unclosed')


def test_identity_keys_the_cache_by_server_url_and_model():
    a = E.Server(FakeClient({}), "vllm", "m", {"id": "m", "root": "/models/m", "max_model_len": 4096, "created": 1})
    b = E.Server(FakeClient({}), "vllm", "m", {"id": "m", "root": "/models/m", "max_model_len": 4096, "created": 2})
    assert a.fingerprint() == b.fingerprint()  # `created` changes at every restart: not identity
    c = E.Server(FakeClient({}), "vllm", "m", {"id": "m", "root": "/models/other", "max_model_len": 4096})
    assert c.fingerprint() != a.fingerprint()
    started = E.Server(FakeClient({}), "llama.cpp", "x.gguf", {"id": "/tmp/a/x.gguf"}, {"model_path": "/tmp/a/x.gguf"},
                       identity_extra={"gguf_sha256": "ab"})
    moved = E.Server(FakeClient({}), "llama.cpp", "y.gguf", {"id": "/tmp/b/y.gguf"}, {"model_path": "/tmp/b/y.gguf"},
                     identity_extra={"gguf_sha256": "ab"})
    assert started.fingerprint() == moved.fingerprint()  # a started server: the file's content, not its port or path
