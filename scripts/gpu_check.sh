#!/usr/bin/env bash
# The one command for a lent CUDA GPU: does this code run, and run right, on a GPU?
#   1. builds the programs and the parity tests with `--features cuda` (release);
#   2. runs the backend parity tests on CUDA against Flex (tests/backends.rs: the layer's forward
#      and gradients for every variant, Burn's fused attention op, the flash op, the fused loss,
#      three AdamW steps of the tiny GPT), failing if no CUDA device answers;
#   3. trains the 60m preset with GPT-2's vocabulary at batch 8 x 512 for 20 steps on the shipped
#      tiny-shakespeare (no network needed) with standard attention and with Euler 1 step, and
#      times one training step of each variant at the 60m shape (train_step_bench);
#   4. samples the device memory of each command (nvidia-smi, every 200 ms);
# all gathered into OUT/gpu-check.md (default runs/gpu-check), with the minutes each part took.
#
#   scripts/gpu_check.sh [--dry-run] [--out DIR]
#
# --dry-run prints every command and its expected minutes and checks that what they name exists,
# without building or running anything (CI runs it). The expected minutes are estimates for a
# 16-core machine with one H100 (no run on a GPU has measured them yet); the whole script is
# meant to fit in 10 minutes. Training in bf16/f16 is not in it: the crate trains in f32 only.
set -euo pipefail
cd "$(dirname "$0")/.."

DRY_RUN=0
OUT=runs/gpu-check
while [ $# -gt 0 ]; do
    case "$1" in
        --dry-run) DRY_RUN=1 ;;
        --out) OUT="$2"; shift ;;
        -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
        *) echo "gpu_check.sh: unknown argument \`$1\` (see --help)" >&2; exit 2 ;;
    esac
    shift
done
BIN=target/release/examples
RUN60=(--backend cuda --preset 60m --tokenizer gpt2 --corpus shakespeare --batch-size 8
    --seq-len 512 --max-steps 20 --warmup 2 --eval-every 20 --eval-windows 8 --force)

# Each step: expected minutes, a description and a command.
declare -a MINUTES=() WHAT=() COMMANDS=()
step() { MINUTES+=("$1"); WHAT+=("$2"); COMMANDS+=("$3"); }

step 4 "build the programs with CUDA (release)" \
    "cargo build --release -p coupled-qk-lab --features cuda --example wikitext_60m --example train_step_bench"
step 2 "build and run the parity tests on CUDA against Flex" \
    "COUPLED_QK_REQUIRE_CUDA=1 cargo test --release -p coupled-qk --features cuda,autodiff --test backends cuda -- --test-threads 1"
step 1 "60m, GPT-2 vocabulary, batch 8 x 512, 20 steps, standard attention" \
    "$BIN/wikitext_60m ${RUN60[*]} --attention standard --out $OUT/60m-standard"
step 1 "60m, GPT-2 vocabulary, batch 8 x 512, 20 steps, Euler 1 step" \
    "$BIN/wikitext_60m ${RUN60[*]} --attention euler1 --out $OUT/60m-euler1"
step 1 "training step at the 60m shape, every variant, flash attention" \
    "$BIN/train_step_bench --backend cuda --only 60m --attention-kernel flash --reps 3 --warmup 2 --out $OUT/bench-60m.json > $OUT/bench-60m.md"

total=0
for m in "${MINUTES[@]}"; do total=$((total + m)); done
echo "gpu_check.sh: ${#COMMANDS[@]} commands, about $total minutes (estimated), output in $OUT"

if [ "$DRY_RUN" = 1 ]; then
    for name in wikitext_60m train_step_bench; do
        test -f "lab/examples/$name.rs" || { echo "gpu_check.sh: no program $name" >&2; exit 1; }
    done
    grep -q 'backend_tests!(cuda' tests/backends.rs \
        || { echo "gpu_check.sh: tests/backends.rs has no CUDA parity tests" >&2; exit 1; }
    for i in "${!COMMANDS[@]}"; do
        printf '# %s (~%s min)\n%s\n' "${WHAT[$i]}" "${MINUTES[$i]}" "${COMMANDS[$i]}"
    done
    exit 0
fi

command -v nvidia-smi > /dev/null || { echo "gpu_check.sh: nvidia-smi not found: this script needs a CUDA GPU" >&2; exit 1; }
mkdir -p "$OUT"
report="$OUT/gpu-check.md"
log="$OUT/gpu-check.log"
: > "$log"
{
    echo "# GPU check"
    echo
    echo "Produced by \`scripts/gpu_check.sh\` on $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1), $(nproc) CPU cores, $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown). Full output: \`gpu-check.log\`."
    echo
    echo "| part | status | seconds | peak device memory (MiB) |"
    echo "|---|---|---|---|"
} > "$report"

failed=0
for i in "${!COMMANDS[@]}"; do
    echo "== ${WHAT[$i]}" | tee -a "$log"
    echo "${COMMANDS[$i]}" | tee -a "$log"
    nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0 -lms 200 > "$OUT/.memory" &
    sampler=$!
    start=$(date +%s)
    # Every part runs even when one fails: the report says which.
    if bash -c "${COMMANDS[$i]}" >> "$log" 2>&1; then status=ok; else status="FAILED ($?)"; failed=1; fi
    elapsed=$(( $(date +%s) - start ))
    kill "$sampler" 2> /dev/null || true
    wait "$sampler" 2> /dev/null || true
    peak=$(sort -n "$OUT/.memory" | tail -1)
    echo "| ${WHAT[$i]} | $status | $elapsed | ${peak:-?} |" >> "$report"
    echo "-> $status in $elapsed s" | tee -a "$log"
done
rm -f "$OUT/.memory"

{
    echo
    echo "## 60m preset, 20 steps (batch 8 x 512, GPT-2 vocabulary, tiny-shakespeare)"
    echo
    echo "| attention | validation loss | training tokens/s |"
    echo "|---|---|---|"
    for v in standard euler1; do
        s="$OUT/60m-$v/summary.json"
        field() { grep -Eo "\"$1\": *[0-9.eE+-]+" "$s" 2> /dev/null | head -1 | sed 's/.*: *//'; }
        echo "| $v | $(field val_loss) | $(field tokens_per_s) |"
    done
    echo
    echo "## Training step at the 60m shape"
    echo
    cat "$OUT/bench-60m.md" 2> /dev/null || echo "(not produced: see gpu-check.log)"
} >> "$report"
echo "gpu_check.sh: wrote $report"
exit "$failed"
