#!/usr/bin/env bash
# The GPU figures in one script, for a person with a CUDA GPU:
#   1. the training-step benchmark: every variant at the tiny, PyTorch-comparison, long-context,
#      one-60m-layer and whole-60m shapes, with explicit and flash attention (tokens/s and ratios
#      to standard attention);
#   2. a short run of the 60m preset per variant (validation loss, tokens/s);
#   3. the peak device memory of each command (nvidia-smi sampled every 200 ms);
# all gathered into OUT/gpu-bench.md.
#
#   scripts/gpu_bench.sh [--dry-run] [--out DIR] [--corpus C] [--steps N]
#
# --dry-run prints every command and the expected GPU time, and checks that the programs it names
# exist, without building or running anything (CI runs it). The corpus must be reachable: the
# default, wikitext-103, is downloaded from the Hugging Face Hub on first use; offline, pass a
# local one (`--corpus sotu`, or a WikiText folder with `--data-dir` in
# EXTRA_FLAGS). The expected times are estimates from the CPU figures in results/performance.md:
# this script has not yet been run on a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."

DRY_RUN=0
OUT=runs/gpu-bench
CORPUS=wikitext-103
STEPS=300
VARIANTS=(standard euler leapfrog mlp-only affine diff)
while [ $# -gt 0 ]; do
    case "$1" in
        --dry-run) DRY_RUN=1 ;;
        --out) OUT="$2"; shift ;;
        --corpus) CORPUS="$2"; shift ;;
        --steps) STEPS="$2"; shift ;;
        -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
        *) echo "gpu_bench.sh: unknown argument \`$1\` (see --help)" >&2; exit 2 ;;
    esac
    shift
done
case "$STEPS" in ''|*[!0-9]*|0) echo "gpu_bench.sh: --steps must be a positive integer, got \`$STEPS\`" >&2; exit 2 ;; esac
EXTRA_FLAGS="${EXTRA_FLAGS:-}"
BIN=target/release/examples

# Each step: an expected time in minutes, a description and a command.
declare -a MINUTES=() WHAT=() COMMANDS=()
step() { MINUTES+=("$1"); WHAT+=("$2"); COMMANDS+=("$3"); }

step 8 "build the programs with CUDA" \
    "cargo build --release --features cuda --example train_step_bench --example wikitext_60m"
step 10 "training-step benchmark, every variant and shape, explicit and flash attention" \
    "$BIN/train_step_bench --backend cuda --with-60m --attention-kernel explicit,flash --reps 7 --warmup 3 --out $OUT/bench-cuda.json > $OUT/bench-cuda.md"
for v in "${VARIANTS[@]}"; do
    step 4 "60m preset, $v, $STEPS steps" \
        "$BIN/wikitext_60m --backend cuda --preset 60m --attention $v --corpus $CORPUS --max-steps $STEPS --warmup $((STEPS / 10 + 1)) --eval-every $STEPS --eval-windows 100 --out $OUT/60m-$v --force $EXTRA_FLAGS"
done

total=0
for m in "${MINUTES[@]}"; do total=$((total + m)); done
echo "gpu_bench.sh: ${#COMMANDS[@]} commands, about $total minutes on one GPU (estimated), output in $OUT"

if [ "$DRY_RUN" = 1 ]; then
    # The programs the commands name must exist.
    for name in train_step_bench wikitext_60m; do
        test -f "lab/examples/$name.rs" || { echo "gpu_bench.sh: no program $name" >&2; exit 1; }
    done
    for i in "${!COMMANDS[@]}"; do
        printf '# %s (~%s min)\n%s\n' "${WHAT[$i]}" "${MINUTES[$i]}" "${COMMANDS[$i]}"
    done
    exit 0
fi

command -v nvidia-smi > /dev/null || { echo "gpu_bench.sh: nvidia-smi not found: this script needs a CUDA GPU" >&2; exit 1; }
mkdir -p "$OUT"
report="$OUT/gpu-bench.md"
{
    echo "# GPU benchmark"
    echo
    echo "Produced by \`scripts/gpu_bench.sh\` on $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), $(date -u +%Y-%m-%d), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)."
    echo
    echo "| command | minutes | peak device memory (MiB) |"
    echo "|---|---|---|"
} > "$report"

for i in "${!COMMANDS[@]}"; do
    echo "== ${WHAT[$i]}"
    echo "${COMMANDS[$i]}"
    # Peak memory in use on GPU 0 while the command runs.
    nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0 -lms 200 > "$OUT/.memory" &
    sampler=$!
    start=$(date +%s)
    bash -c "${COMMANDS[$i]}"
    elapsed=$(( $(date +%s) - start ))
    kill "$sampler" 2> /dev/null || true
    wait "$sampler" 2> /dev/null || true
    peak=$(sort -n "$OUT/.memory" | tail -1)
    echo "| ${WHAT[$i]} | $((elapsed / 60)).$(( (elapsed % 60) / 6 )) | ${peak:-?} |" >> "$report"
done
rm -f "$OUT/.memory"

{
    echo
    echo "## Training-step benchmark"
    echo
    cat "$OUT/bench-cuda.md"
    echo
    echo "## 60m preset, $STEPS steps on $CORPUS"
    echo
    echo "| variant | validation loss | perplexity | tokens/s |"
    echo "|---|---|---|---|"
    for v in "${VARIANTS[@]}"; do
        s="$OUT/60m-$v/summary.json"
        field() { grep -Eo "\"$1\": *[0-9.eE+-]+" "$s" | head -1 | sed 's/.*: *//'; }
        echo "| $v | $(field val_loss) | $(field val_ppl) | $(field tokens_per_s) |"
    done
} >> "$report"
echo "gpu_bench.sh: wrote $report"
