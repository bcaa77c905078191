#!/usr/bin/env bash
# MaP reproduction with MiniLM on SQuAD v1.1 from ../shared/data (spec: reproductions/map/map_squad.yaml).
# Run from the repository root:   bash reproductions/map/map_squad.sh [--only PATTERN ...]
# (~25 min per run on 2 CPU cores, 12 runs; `--only 'map_e/*'` etc. splits the grid over processes.)
set -euo pipefail
cd "$(dirname "$0")/../.."
PB=.venv/bin/posbias
SHARED=${POSBIAS_SHARED_DATA:-../shared/data}
T=$SHARED/squad_v1.1_train_reconstructed
# Data is built under bench/out/ (git-ignored), where the specs read it: a data path is part of a run's
# config hash, so the archived stores' runs keep theirs only at these paths.
OUT=bench/out/map_data
[ -f $OUT/train8000/train.json ] || $PB data build --input "$T"/train-v1.1-reconstructed.part{1,2,3}of3.json.gz \
    --out $OUT/train8000 --name train --exclude-ambiguous --sample 8000 --seed 13
# Official dev split into random halves (seed 13): 500 questions of one for validation, 2,000 of the other for test.
[ -f $OUT/dev_val500/val.json ] || $PB data build --input "$SHARED"/squad_v1.1/dev-v1.1.json.gz --out $OUT/dev_val500 \
    --split --sample 500 --seed 13
[ -f $OUT/dev_test2000/test.json ] || $PB data build --input "$SHARED"/squad_v1.1/dev-v1.1.json.gz --out $OUT/dev_test2000 \
    --split --sample 2000 --seed 13
$PB experiment run reproductions/map/map_squad.yaml "$@"
$PB experiment report runs/experiments/map_squad
