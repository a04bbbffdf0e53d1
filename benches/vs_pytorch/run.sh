#!/usr/bin/env bash
# Side-by-side training step: the crate's `train_step_bench` (standard attention, one process per
# shape and attention kernel) against PyTorch eager on the CPU (SDPA and explicit attention), one
# process at a time. Run from the repository root:
#
#     bash benches/vs_pytorch/run.sh
#
# Environment: SHAPES, KERNELS, REPS, WARMUP, OUT, THREADS (PyTorch's threads), CRATE_ARGS (extra
# arguments for train_step_bench, e.g. `--loss explicit`), CARGO_TARGET_DIR.
set -euo pipefail

SHAPES=${SHAPES:-torch-small torch-medium long 60m}
KERNELS=${KERNELS:-explicit flash}
REPS=${REPS:-5}
WARMUP=${WARMUP:-2}
OUT=${OUT:-runs/vs_pytorch}
THREADS=${THREADS:-2}
CRATE_ARGS=${CRATE_ARGS:-}
TARGET_DIR=${CARGO_TARGET_DIR:-target}
BENCH="$TARGET_DIR/release/examples/train_step_bench"
HERE=benches/vs_pytorch

if [[ ! -f "$HERE/torch_gpt.py" ]]; then
    echo "error: run this from the repository root (no $HERE/torch_gpt.py here)" >&2
    exit 2
fi
mkdir -p "$OUT"

echo "== building train_step_bench (release)" >&2
cargo build --release -p coupled-qk-lab --example train_step_bench

for shape in $SHAPES; do
    extra=()
    # The whole 60m preset is behind a flag of its own.
    [[ "$shape" == 60m ]] && extra+=(--with-60m)
    # shellcheck disable=SC2206 # CRATE_ARGS is split on purpose
    extra+=($CRATE_ARGS)
    for kernel in $KERNELS; do
        echo "== crate: $shape, $kernel kernel" >&2
        "$BENCH" --only "$shape" --variants standard --attention-kernel "$kernel" \
            --reps "$REPS" --warmup "$WARMUP" ${extra[@]+"${extra[@]}"} \
            --out "$OUT/crate-$shape-$kernel.json"
    done
    for attention in sdpa explicit; do
        echo "== pytorch: $shape, $attention attention" >&2
        python3 "$HERE/torch_gpt.py" --shape "$shape" --attention "$attention" \
            --threads "$THREADS" --reps "$REPS" --warmup "$WARMUP" \
            > "$OUT/torch-$shape-$attention.json.tmp"
        mv "$OUT/torch-$shape-$attention.json.tmp" "$OUT/torch-$shape-$attention.json"
    done
done

python3 "$HERE/report.py" "$OUT"
