"""The GPU check's plumbing, testable without a GPU: the `gpu` marker, the `device` fixture's cases,
and `tools/gpu/gpu_check.py` / `make gpu-check` saying "skipped" (exit 0) where torch sees no GPU.
The smoke grid itself runs on the CPU with `python tools/gpu/gpu_check.py --device cpu` (minutes)."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import CPU_ONLY_ENV, DEVICES

REPO = Path(__file__).resolve().parents[2]
SKIPPED = "no CUDA GPU: gpu-check skipped"


def test_gpu_marker_is_registered(pytestconfig):
    assert any(line.split(":")[0].strip() == "gpu" for line in pytestconfig.getini("markers"))


def test_only_the_cuda_case_of_the_device_fixture_is_marked_gpu():
    marks = {p.values[0]: [m.name for m in p.marks] for p in DEVICES}
    assert marks == {"cpu": [], "cuda": ["gpu"]}


def test_auto_resolves_to_the_cpu_outside_device_tests():
    import posbias.devices

    assert posbias.devices.resolve_device("auto").type == "cpu"


def test_gpu_check_without_cuda_says_skipped_and_exits_0(tmp_path):
    env = {**os.environ, **CPU_ONLY_ENV}  # torch sees no GPU, on any machine
    r = subprocess.run([sys.executable, str(REPO / "tools" / "gpu" / "gpu_check.py"), "--out", str(tmp_path / "gc")],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == SKIPPED, (r.stdout, r.stderr[-2000:])
    assert not (tmp_path / "gc").exists()


@pytest.mark.skipif(shutil.which("make") is None, reason="no make")
def test_make_gpu_check_without_cuda_says_skipped_and_exits_0():
    env = {**os.environ, **CPU_ONLY_ENV}
    # GPU_PY: this Python, so the target does not (re)build the venv
    r = subprocess.run(["make", "-s", "gpu-check", f"GPU_PY={sys.executable}", "GPU_OUT=/nonexistent/never"],
                       cwd=REPO, capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == SKIPPED, (r.stdout, r.stderr[-2000:])


def _gpu_check():
    """tools/gpu/gpu_check.py as a module (tools/ is no package)."""
    import importlib.util

    if "gpu_check" not in sys.modules:
        spec = importlib.util.spec_from_file_location("gpu_check", REPO / "tools" / "gpu" / "gpu_check.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules["gpu_check"] = module  # dataclasses look their module up there
        spec.loader.exec_module(module)
    return sys.modules["gpu_check"]


@pytest.mark.parametrize("written,code,error", [
    ("cuda:0", 0, None),
    ("cpu", 0, "ran on ['cpu'], not cuda"),  # a run that fell back to the CPU is a failure
    (None, 0, "no run_info.json under"),
    ("cuda", 3, "exit code 3"),
])
def test_a_command_passes_only_with_exit_0_and_every_run_info_on_the_device(tmp_path, written, code, error):
    gc = _gpu_check()
    out = tmp_path / "out"
    write = ("import json, pathlib, sys; p = pathlib.Path(sys.argv[1]); p.mkdir(parents=True); "
             f"p.joinpath('run_info.json').write_text(json.dumps({{'hardware': {{'device': {written!r}}}}}))"
             if written else "")
    argv = [sys.executable, "-c", f"{write}\nimport sys; print('boom', file=sys.stderr); sys.exit({code})", str(out)]
    (tmp_path / "logs").mkdir()
    res = gc.run_step(gc.Step("x", argv, out), "cuda", dict(os.environ), tmp_path / "logs", timeout=60)
    assert res["ok"] == (error is None) and res["returncode"] == code
    if error:
        assert error in res["error"] and "boom" in res["stderr_tail"]
