#!/usr/bin/env bash
# Random Padding reproduction (train short, test long) with MiniLM on SQuAD v1.1 from ../shared/data.
# Builds the data sets, runs baseline vs random_padding x 3 seeds, writes the report.
# Run from the repository root:   bash reproductions/random_padding/random_padding.sh   (~1 h on 2 CPU cores)
set -euo pipefail
cd "$(dirname "$0")/../.."
PB=.venv/bin/posbias
SHARED=${POSBIAS_SHARED_DATA:-../shared/data}
T=$SHARED/squad_v1.1_train_reconstructed
# Data is built under bench/out/ (git-ignored), where the specs read it: a data path is part of a run's
# config hash, so the archived stores' runs keep theirs only at these paths.
OUT=bench/out/rp_data
# D_50 train: contexts cut to 50 words; answers cut off -> unanswerable (dropped for v1); 4,000 sampled.
$PB data build --input "$T"/train-v1.1-reconstructed.part{1,2,3}of3.json.gz --out $OUT/train_d50 \
    --truncate 50 --name train --sample 4000 --seed 13
# Official dev split into random halves (seed 13): 500 questions of one for validation, 2,000 of the other for test.
$PB data build --input "$SHARED"/squad_v1.1/dev-v1.1.json.gz --out $OUT/dev_val500 --split --sample 500 --seed 13
$PB data build --input "$SHARED"/squad_v1.1/dev-v1.1.json.gz --out $OUT/dev_test2000 --split --sample 2000 --seed 13
$PB experiment run reproductions/random_padding/rp_squad_d50.yaml
$PB experiment report runs/experiments/rp_squad_d50
