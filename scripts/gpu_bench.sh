#!/usr/bin/env bash
# Issue 7's GPU benchmark: builds with CUDA and runs the training-step benchmark (every variant,
# the tiny and PyTorch-comparison shapes, one 60m layer and the whole 60m preset), writing
# bench-cuda.json (and the printed table) into OUT. Budget: under 8 minutes on one GPU, build
# included (the build dominates: ~6 minutes cold on 2 cores, less on a GPU machine's CPUs).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-runs/bench}"
mkdir -p "$OUT"
cargo build --release --features cuda --example train_step_bench
timeout 420 ./target/release/examples/train_step_bench --backend cuda --with-60m --reps 7 --warmup 3 \
    --out "$OUT/bench-cuda.json" | tee "$OUT/bench-cuda.md"
