#!/usr/bin/env bash
# Two ranks of the 60m preset on two CUDA GPUs, summing gradients with NCCL and then with MPI
# through the host: the same run both ways (final validation losses equal to rounding), and what
# NCCL saves per step. Needs a machine with two or more CUDA GPUs, NCCL and an MPI
# launcher (MPICH: apt-get install mpich libmpich-dev libclang-dev); cudarc loads NCCL as libnccl.so
# (docs/training.md, "NCCL on CUDA").
#
#   scripts/nccl_check.sh [--dry-run] [--out DIR] [--steps N]
#
# --dry-run prints the commands without building or running anything (CI runs it). The corpus is
# the one shipped with the harness (tiny-shakespeare), so no network is needed. The results go to
# OUT/nccl-check.md.
set -euo pipefail
cd "$(dirname "$0")/.."

DRY_RUN=0
OUT=runs/nccl-check
STEPS=40
while [ $# -gt 0 ]; do
    case "$1" in
        --dry-run) DRY_RUN=1 ;;
        --out) OUT="$2"; shift ;;
        --steps) STEPS="$2"; shift ;;
        -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
        *) echo "nccl_check.sh: unknown argument \`$1\` (see --help)" >&2; exit 2 ;;
    esac
    shift
done
case "$STEPS" in ''|*[!0-9]*|0) echo "nccl_check.sh: --steps must be a positive integer, got \`$STEPS\`" >&2; exit 2 ;; esac
BIN=target/release/examples/wikitext_60m
# MPICH runs as root without flags; Open MPI needs --allow-run-as-root (docs/training.md).
LAUNCH="${LAUNCH:-mpiexec -n 2}"

declare -a WHAT=() COMMANDS=()
step() { WHAT+=("$1"); COMMANDS+=("$2"); }
step "build with MPI and CUDA" "cargo build --release --features mpi,cuda --example wikitext_60m"
for collective in nccl mpi; do
    step "2 ranks, 60m, $collective" \
        "$LAUNCH $BIN --backend cuda --devices 1 --preset 60m --corpus shakespeare --max-steps $STEPS --warmup $((STEPS / 10 + 1)) --eval-every $STEPS --eval-windows 32 --collective $collective --out $OUT/60m-2ranks-$collective --force"
done

if [ "$DRY_RUN" = 1 ]; then
    test -f lab/examples/wikitext_60m.rs || { echo "nccl_check.sh: no program wikitext_60m" >&2; exit 1; }
    for i in "${!COMMANDS[@]}"; do
        printf '# %s\n%s\n' "${WHAT[$i]}" "${COMMANDS[$i]}"
    done
    exit 0
fi

command -v nvidia-smi > /dev/null || { echo "nccl_check.sh: nvidia-smi not found: this script needs CUDA GPUs" >&2; exit 1; }
gpus=$(nvidia-smi --query-gpu=name --format=csv,noheader | wc -l)
[ "$gpus" -ge 2 ] || { echo "nccl_check.sh: $gpus GPU(s): NCCL's ranks need a GPU each, so two at least" >&2; exit 1; }
mkdir -p "$OUT"
report="$OUT/nccl-check.md"
{
    echo "# NCCL against MPI, two ranks of the 60m preset"
    echo
    echo "Produced by \`scripts/nccl_check.sh --steps $STEPS\` on ${gpus}x $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), $(date -u +%Y-%m-%d), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)."
    echo
    echo "| command | seconds |"
    echo "|---|---|"
} > "$report"
for i in "${!COMMANDS[@]}"; do
    echo "== ${WHAT[$i]}"
    echo "${COMMANDS[$i]}"
    start=$(date +%s)
    bash -c "${COMMANDS[$i]}"
    echo "| ${WHAT[$i]} | $(( $(date +%s) - start )) |" >> "$report"
done
{
    echo
    echo "Each run's summary.json (final validation loss, tokens/s):"
    for collective in nccl mpi; do
        echo
        echo "$collective:"
        echo '```json'
        cat "$OUT/60m-2ranks-$collective/summary.json"
        echo
        echo '```'
    done
} >> "$report"
cat "$report"
