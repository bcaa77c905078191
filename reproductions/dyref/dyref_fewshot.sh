#!/usr/bin/env bash
# DyReF few-shot reproduction with MiniLM on SQuAD v1.1 from ../shared/data.
# Run from the repository root:  bash reproductions/dyref/dyref_fewshot.sh [--only PATTERN ...]
# (spec: reproductions/dyref/dyref_fewshot.yaml: Table 2, and Table 3's mask variants at n = 512; 48 runs:
# 5 seeds for every method at n = 512, 3 at n = 128 and 1,024)
set -euo pipefail
cd "$(dirname "$0")/../.."
SPEC=reproductions/dyref/dyref_fewshot.yaml
PB=.venv/bin/posbias
SHARED=${POSBIAS_SHARED_DATA:-../shared/data}
T=$SHARED/squad_v1.1_train_reconstructed
# Data is built under bench/out/ (git-ignored), where the specs read it: a data path is part of a run's
# config hash, so the archived stores' runs keep theirs only at these paths.
OUT=bench/out/dyref_data
# The pool the few-shot sets are drawn from: every rebuilt train question with an unambiguous offset.
[ -f $OUT/train_pool/train.json ] || $PB data build --input "$T"/train-v1.1-reconstructed.part{1,2,3}of3.json.gz \
    --out $OUT/train_pool --name train --exclude-ambiguous
# A fixed sample of 1,000 official dev questions.
[ -f $OUT/dev1000/data.json ] || $PB data build --input "$SHARED"/squad_v1.1/dev-v1.1.json.gz --out $OUT/dev1000 \
    --sample 1000 --seed 13
$PB experiment run $SPEC "$@"
$PB experiment report "runs/experiments/$(basename $SPEC .yaml)"
# Table 3: the mask variants against `mean` (full attention) at n = 512, in a report of their own.
$PB experiment report "runs/experiments/$(basename $SPEC .yaml)" --only 'n512/mean/*' 'n512/mask_*' \
    --baseline mean --output-dir "runs/experiments/$(basename $SPEC .yaml)/table3_n512_vs_mean" \
    || echo "(no Table 3 report: no n = 512 runs of mean or the mask variants yet)"
