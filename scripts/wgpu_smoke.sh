#!/usr/bin/env bash
# End to end on WGPU: `wikitext_60m` and `mqar` train for two steps with `--backend wgpu` and their
# output folders are checked. Needs a WGPU adapter (a GPU, or Mesa's software Vulkan driver:
# `apt-get install mesa-vulkan-drivers libvulkan1`). Built with the test build's features and
# profile, so that after `cargo test --features wgpu,ndarray` it compiles nothing new.
set -euo pipefail
cd "$(dirname "$0")/.."
FEATURES="${FEATURES:-wgpu,ndarray}"
OUT="$(mktemp -d)"
trap 'rm -rf "$OUT"' EXIT

fail() { echo "wgpu_smoke: $*" >&2; exit 1; }
# `file` exists and holds `pattern` (an extended regular expression).
expect() { grep -Eq "$2" "$1" || fail "$1 does not match /$2/:"$'\n'"$(head -c 2000 "$1")"; }

# Any text trains with the byte tokenizer: the repository's own docs, ~100 kB.
cat README.md docs/*.md results/*.md > "$OUT/corpus.txt"
cargo run --features "$FEATURES" --example wikitext_60m -- --backend wgpu --preset tiny \
    --tokenizer bytes --corpus "$OUT/corpus.txt" --attention euler --max-steps 2 --warmup 1 \
    --seq-len 64 --batch-size 2 --eval-every 2 --eval-windows 2 --cache-dir "$OUT/cache" \
    --out "$OUT/lm"
for f in config.json metrics.csv summary.json; do
    test -s "$OUT/lm/$f" || fail "wikitext_60m wrote no $f"
done
expect "$OUT/lm/config.json" '"backend": *"[^"]*wgpu'
expect "$OUT/lm/metrics.csv" '^2,'
expect "$OUT/lm/summary.json" '"val_loss": *[0-9]'

cargo run --features "$FEATURES" --example mqar -- --backend wgpu --variants standard,euler \
    --tasks 16:2 --d-models 16 --lrs 0.003 --vocab 32 --steps 2 --batch-size 8 \
    --train-examples 16 --test-examples 8 --seeds 0 --out "$OUT/mqar"
for f in results.json results.md; do
    test -s "$OUT/mqar/$f" || fail "mqar wrote no $f"
done
expect "$OUT/mqar/results.json" '"backend": *"[^"]*wgpu'
expect "$OUT/mqar/results.json" '"accuracy": *[0-9]'
echo "wgpu_smoke: wikitext_60m and mqar trained on WGPU and wrote their results"
