"""`posbias diagnose generation` against real LLM servers on 127.0.0.1 (tests/generation/servers.py):
llama.cpp's server and `transformers serve`, each serving a tiny random Llama that this process also
loads, so the served scores are compared with the in-process ones on the same prompts. A server that
is killed mid-run, posbias killed with a server it started, and a key that must not leak."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from posbias.errors import ConfigError, ServerError
from posbias.generation import diagnose as D
from posbias.generation import endpoint as E
from tests.generation import servers as S

OPTS = dict(k=3, bias_samples=50, min_bucket=2, max_new_tokens=4, progress=False)
LOGLIK_TOLERANCE = 1e-4
"""Nats per answer token between llama.cpp (f32 weights and cache) and the fp32 model here: measured
1.2e-6 on these prompts; summation order differs between the two, so a few ulps of float32 per layer."""


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    pytest.importorskip("gguf")
    return S.tiny_models(tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="module")
def llama(models, tmp_path_factory):
    exe = S.require_llama()
    srv = S.llama_server(exe, models[1], tmp_path_factory.mktemp("llama") / "log").start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def tserve(models, tmp_path_factory):
    exe = S.require_transformers_serve()
    srv = S.transformers_serve(exe, models[0], tmp_path_factory.mktemp("tserve") / "log").start(timeout=180)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def in_process(models, tmp_path_factory):
    """The in-process diagnosis of the served model (fp32), both scorings: what the servers must match."""
    tmp = tmp_path_factory.mktemp("inproc")
    data = S.squad(tmp / "squad.json")
    res = D.diagnose(str(models[0]), data, tmp / "out", scorings=("loglik", "generation"), cache_dir=tmp / "cache",
                     mitigations=("reorder",), precision="fp32", device="cpu", **OPTS)
    return data, res, tmp / "out"


def _scores(out: Path) -> dict:
    return json.loads((out / "scores.json").read_text())


def _predictions(out: Path, like: Path | None = None) -> dict:
    """The generated answers in `out`, under the conditions `like`'s diagnosis has (all without it)."""
    pred = json.loads((out / "predictions.json").read_text())
    keys = pred.keys() if like is None else json.loads((like / "predictions.json").read_text()).keys()
    return {k: v for k, v in pred.items() if k in keys}


def test_llama_cpp_server_scores_as_the_model_in_this_process(llama, in_process, tmp_path):
    data, ref, ref_out = in_process
    res = D.diagnose(None, data, tmp_path / "out", endpoint=llama.url + "/v1", scorings=("loglik", "generation"),
                     mitigations=("reorder",), cache_dir=tmp_path / "cache", concurrency=2, **OPTS)
    srv = res["model"]["server"]
    assert (srv["kind"], srv["loglik_protocol"], srv["prompts_as"]) == ("llama.cpp", "forced", "token ids")
    assert srv["tokenizer"] == "the server's /tokenize" and srv["requests"] > 0
    ours, theirs = _scores(ref_out), _scores(tmp_path / "out")
    assert theirs["question_ids"] == ours["question_ids"]
    for key in (k for k in ours if k.endswith("/logprob")):
        assert np.max(np.abs(np.array(theirs[key]) - np.array(ours[key]))) < LOGLIK_TOLERANCE, key
    assert _predictions(tmp_path / "out") == _predictions(ref_out)  # greedy answers equal, every prompt
    assert res["verdicts"]["accuracy"]["original"]["curve"] == ref["verdicts"]["accuracy"]["original"]["curve"]
    assert "loglik/reorder/logprob" in theirs  # reordering works over an endpoint, compared above with the rest
    md = (tmp_path / "out" / "diagnosis.md").read_text()
    assert "server: llama.cpp at" in md and "forced tokens" in md
    info = json.loads((tmp_path / "out" / "run_info.json").read_text())
    assert info["server"]["identity"]["server"] == "llama.cpp"


def test_transformers_serve_generates_as_the_model_in_this_process(tserve, models, in_process, tmp_path):
    data, _, ref_out = in_process
    res = D.diagnose(None, data, tmp_path / "out", endpoint=tserve.url, tokenizer=str(models[0]),
                     scorings=("generation",), cache_dir=tmp_path / "cache", **OPTS)
    srv = res["model"]["server"]
    assert srv["kind"] == "openai-compatible" and srv["prompts_as"] == "text"
    assert srv["tokenizer_check"].startswith("token counts equal to the server's usage.prompt_tokens on 4 of 4")
    assert _predictions(tmp_path / "out") == _predictions(ref_out, like=tmp_path / "out")


def test_a_server_without_log_probabilities_is_refused_before_any_work(tserve, models, in_process, tmp_path):
    data = in_process[0]
    with pytest.raises(ConfigError, match="returns no prompt log-probabilities .* use --scoring generation") as e:
        D.diagnose(None, data, tmp_path / "out", endpoint=tserve.url, tokenizer=str(models[0]), scorings=("loglik",),
                   cache_dir=tmp_path / "cache", **OPTS)
    assert "\n" not in str(e.value)
    assert not (tmp_path / "out").exists() and not (tmp_path / "cache" / "generation").exists()


def test_a_tokenizer_that_is_not_the_servers_is_refused(tserve, in_process, tmp_path):
    other = str(Path(__file__).parents[2] / "posbias" / "resources" / "tiny_bpe_roberta")
    with pytest.raises(ConfigError, match="--tokenizer: .* counts .* tokens in sample prompt 1, the server"):
        D.diagnose(None, in_process[0], tmp_path / "out", endpoint=tserve.url, tokenizer=other,
                   scorings=("generation",), cache_dir=tmp_path / "cache", **OPTS)


def test_a_local_tokenizer_is_checked_against_the_servers_tokenize(llama, models, in_process, tmp_path):
    res = D.diagnose(None, in_process[0], tmp_path / "out", endpoint=llama.url, tokenizer=str(models[0]),
                     scorings=("loglik",), cache_dir=tmp_path / "cache", **OPTS)
    assert res["model"]["server"]["tokenizer_check"] == "ids equal to the server's /tokenize on 4 of 4 sample prompts"


def test_a_server_killed_mid_run_keeps_the_scores_and_the_next_run_resumes(models, in_process, tmp_path, monkeypatch):
    exe = S.require_llama()
    data = in_process[0]
    srv = S.llama_server(exe, models[1], tmp_path / "log").start()
    calls = {"n": 0}
    real = E.ServedLM._loglik_one

    def dies_after_five(self, e, proto):
        if proto == "forced":
            calls["n"] += 1
            if calls["n"] == 7:  # the probe, then 5 prompts scored: the server dies
                srv.kill()
        return real(self, e, proto)

    monkeypatch.setattr(E.ServedLM, "_loglik_one", dies_after_five)
    try:
        with pytest.raises(ServerError, match="stopped answering") as err:
            D.diagnose(None, data, tmp_path / "out", endpoint=srv.url, scorings=("loglik",), cache_dir=tmp_path / "cache",
                       concurrency=1, retries=1, timeout=5, **OPTS)
        assert "\n" not in str(err.value) and not (tmp_path / "out").exists()
        kept = [json.loads(x) for f in (tmp_path / "cache").rglob("loglik.jsonl") for x in f.read_text().splitlines()]
        assert len(kept) == 5  # every prompt finished before the kill
        monkeypatch.setattr(E.ServedLM, "_loglik_one", real)
        srv = S.llama_server(exe, models[1], tmp_path / "log", port=srv.port).start()  # the same server again
        res = D.diagnose(None, data, tmp_path / "out", endpoint=srv.url, scorings=("loglik",),
                         cache_dir=tmp_path / "cache", **OPTS)
    finally:
        srv.stop()
    n = res["questions"] * 3
    assert res["prompts_computed"]["loglik, original"] == n - 5
    whole = in_process[1]
    assert np.allclose([c["score"] for c in res["verdicts"]["loglik"]["original"]["curve"]],
                       [c["score"] for c in whole["verdicts"]["loglik"]["original"]["curve"]], atol=1e-3)


def test_a_server_that_comes_back_serving_another_model_is_refused(models, in_process, tmp_path, monkeypatch):
    exe = S.require_llama()
    other = S.tiny_models(tmp_path, seed=1)[1]
    srv = S.llama_server(exe, models[1], tmp_path / "log").start()
    swapped, calls = {}, {"n": 0}
    real = E.ServedLM._loglik_one

    def swap(self, e, proto):
        if proto == "forced":
            calls["n"] += 1
            if calls["n"] == 3:  # the probe and one prompt on the first model; then another takes the port
                srv.kill()
                swapped["srv"] = S.llama_server(exe, other, tmp_path / "log2", port=srv.port)
                threading.Timer(0.3, swapped["srv"].start).start()
        return real(self, e, proto)

    monkeypatch.setattr(E.ServedLM, "_loglik_one", swap)
    try:
        with pytest.raises(ServerError, match="came back from a failure serving another model"):
            D.diagnose(None, in_process[0], tmp_path / "out", endpoint=srv.url, scorings=("loglik",),
                       cache_dir=tmp_path / "cache", concurrency=1, retries=3, **OPTS)
    finally:
        srv.stop()
        swapped.get("srv") and swapped["srv"].stop()
    kept = [x for f in (tmp_path / "cache").rglob("loglik.jsonl") for x in f.read_text().splitlines()]
    assert len(kept) == 1  # the first model's one score; nothing of the second joined it


def test_a_gguf_is_served_by_a_llama_cpp_server_posbias_starts_and_stops(models, in_process, tmp_path):
    S.require_llama()
    data, _, ref_out = in_process
    res = D.diagnose(str(models[1]), data, tmp_path / "out", scorings=("loglik", "generation"),
                     cache_dir=tmp_path / "cache", llama_server_args=" ".join(S.EXACT), **OPTS)
    assert res["model"]["kind"].startswith("GGUF served by llama.cpp's llama-server")
    started = res["model"]["server"]["started_by_posbias"]
    assert started["slots"] == 4 and started["slot_tokens"] >= 4096
    assert not Path(f"/proc/{started['pid']}").exists()  # stopped when the diagnosis ended
    ours, theirs = _scores(ref_out), _scores(tmp_path / "out")
    assert np.max(np.abs(np.array(theirs["loglik/original/logprob"]) - ours["loglik/original/logprob"])) < LOGLIK_TOLERANCE
    assert _predictions(tmp_path / "out") == _predictions(ref_out, like=tmp_path / "out")
    assert "(converted, cached)" not in json.dumps(res["model"])
    assert not list((tmp_path / "cache").glob("gguf/*/config.json"))  # nothing was de-quantised


def test_the_transformers_backend_and_ms_poe_take_the_gguf_in_process(models, in_process, tmp_path):
    S.require_llama()
    res = D.diagnose(str(models[1]), in_process[0], tmp_path / "out", scorings=("loglik",), backend="transformers",
                     cache_dir=tmp_path / "cache", **OPTS)
    assert res["model"]["kind"] == "GGUF (converted, cached)"
    res = D.diagnose(str(models[1]), in_process[0], tmp_path / "out2", scorings=("loglik",), mitigations=("mspoe",),
                     cache_dir=tmp_path / "cache", **OPTS)
    assert res["model"]["kind"] == "GGUF (converted, cached)"  # Ms-PoE needs the weights here


def _children(pid: int) -> list[int]:
    out = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                fields = (p / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                out.append(int(p.name))
    return out


def _cli(args, env=None, **kw):
    return subprocess.Popen([sys.executable, "-m", "posbias", "-q", "diagnose", "generation", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, **(env or {})}, **kw)


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _server_child(proc, timeout: float = 60.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        kids = [c for c in _children(proc.pid) if b"--port" in _cmdline(c)]
        if kids:
            return kids[0]
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.02)
    raise AssertionError("no llama-server child started")


def _gone(pid: int, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return True
        if state == "Z":  # ended, not yet reaped by its (dead) parent's reaper
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize("sig, code", [(signal.SIGKILL, -9), (signal.SIGTERM, 143)])
def test_posbias_ended_by_a_signal_takes_its_llama_server_with_it(models, tmp_path, sig, code):
    S.require_llama()
    data = S.squad(tmp_path / "squad.json", questions=40)
    proc = _cli(["--model", str(models[1]), "--data", str(data), "--output-dir", str(tmp_path / "out"), "--k", "6",
                 "--scoring", "loglik", "generation", "--cache-dir", str(tmp_path / "cache")])
    child = _server_child(proc)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == code, err
    assert _gone(child), "the llama-server posbias started outlived it"
    if sig == signal.SIGTERM:
        assert err.strip().splitlines()[-1].startswith("posbias: interrupted")


def test_a_key_from_the_environment_is_sent_and_written_nowhere(models, in_process, tmp_path):
    exe = S.require_llama()
    key = "sk-posbias-test-7f3a9c"
    srv = S.llama_server(exe, models[1], tmp_path / "log", extra=("--api-key", key))
    srv.ready_path = "/health"  # llama.cpp answers /health without the key
    srv.start()
    try:
        base = ["--endpoint", srv.url, "--data", str(in_process[0]), "--k", "3", "--scoring", "loglik", "generation",
                "--cache-dir", str(tmp_path / "cache"), "--bootstrap-samples", "20", "--min-bucket", "2",
                "--max-new-tokens", "3"]
        ok = _cli([*base, "--output-dir", str(tmp_path / "out"), "--api-key-env", "POSBIAS_TEST_KEY"],
                  env={"POSBIAS_TEST_KEY": key})
        out, err = ok.communicate(timeout=300)
        assert ok.returncode == 0, err
        assert key not in out + err
        for f in [*(tmp_path / "out").rglob("*"), *(tmp_path / "cache").rglob("*")]:
            if f.is_file():
                assert key.encode() not in f.read_bytes(), f
        for extra, env, message in ((["--api-key-env", "POSBIAS_TEST_KEY"], {"POSBIAS_TEST_KEY": "wrong"}, "HTTP 401"),
                                    ([], {}, "HTTP 401"),
                                    (["--api-key-env", "POSBIAS_UNSET_KEY"], {}, "POSBIAS_UNSET_KEY is not set")):
            bad = _cli([*base, "--output-dir", str(tmp_path / "bad"), *extra], env=env)
            out, err = bad.communicate(timeout=120)
            assert bad.returncode == 2 and err.count("\n") == 1 and message in err, err
            assert key not in err and "Traceback" not in err
    finally:
        srv.stop()


def test_a_server_that_does_not_answer_is_one_line(tmp_path, in_process):
    port = S.free_port()  # nothing listens there
    proc = _cli(["--endpoint", f"http://127.0.0.1:{port}/v1", "--data", str(in_process[0]), "--output-dir",
                 str(tmp_path / "out"), "--retries", "0"])
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 2 and err.count("\n") == 1 and "stopped answering" in err, err
