#!/usr/bin/env bash
# The programs against hostile but fair input: each case runs `wikitext_60m` or `generate` and
# checks its exit status, a pattern of its message and, for a refused run, that no run folder was
# written. Every experiment file (experiments/*.toml) must parse for its program. Built with the test build's features and profile (as scripts/wgpu_smoke.sh), so that
# after `cargo test --features wgpu,ndarray` little is compiled. CI runs it.
set -euo pipefail
cd "$(dirname "$0")/.."
FEATURES="${FEATURES:-wgpu,ndarray}"
OUT="$(mktemp -d)"
trap 'rm -rf "$OUT"' EXIT

cargo build --features "$FEATURES" --example wikitext_60m --example generate --example ablations \
    --example compute_matched --example corpus_sensitivity --example mqar --example train_step_bench
BIN="${CARGO_TARGET_DIR:-target}/debug/examples"
W=("$BIN/wikitext_60m" --backend flex --preset tiny --tokenizer bytes --corpus shakespeare
    --eval-every 2 --eval-windows 2 --cache-dir "$OUT/cache")

fail() { echo "program_checks: $*" >&2; exit 1; }
# `refused NAME PATTERN ARGS...`: wikitext_60m ARGS --out OUT/NAME fails, says PATTERN (an extended
# regular expression) and leaves no OUT/NAME.
refused() {
    local name="$1" pattern="$2"
    shift 2
    if "${W[@]}" "$@" --out "$OUT/$name" > "$OUT/$name.log" 2>&1; then
        fail "$name: accepted: ${*}"
    fi
    grep -Eq "$pattern" "$OUT/$name.log" || fail "$name: no /$pattern/ in:"$'\n'"$(cat "$OUT/$name.log")"
    [ ! -e "$OUT/$name" ] || fail "$name: a refused run wrote $OUT/$name"
    echo "program_checks: $name: refused as expected"
}

refused overflow-batch 'overflow a 64-bit count' \
    --max-steps 2 --batch-size 4294967296 --grad-accum 4294967296
refused overflow-batch-alone 'overflow a 64-bit count' --batch-size 18446744073709551615
refused overflow-tokens 'overflows a 64-bit token count' \
    --tokens 18446744073709551615 --stop-at 1
refused batch-beyond-corpus 'holds more than the [0-9]+ training tokens' \
    --batch-size 100000000 --max-steps 2
refused steps-conflict 'names 3 integrator steps' --attention euler3 --steps 2 --max-steps 2
refused steps-ignored 'has no integrator steps' --attention standard --steps 3 --max-steps 2
refused steps-too-many 'more than the 64' --attention euler100000 --max-steps 2
# Flags are checked before the corpus is loaded or downloaded: WikiText-103 is not on this
# machine, and the message is the flag's, not a download's.
if "$BIN/wikitext_60m" --backend flex --preset tiny --tokenizer bytes --corpus wikitext103 \
    --attention euler100000 --cache-dir "$OUT/cache" --out "$OUT/early" > "$OUT/early.log" 2>&1; then
    fail "euler100000 on wikitext103 was accepted"
fi
grep -q 'more than the 64' "$OUT/early.log" && ! grep -qi 'download' "$OUT/early.log" \
    || fail "flags checked after the corpus:"$'\n'"$(cat "$OUT/early.log")"
echo "program_checks: flags are checked before the corpus is loaded"

# A backend that does not start says why and what to do, and `auto` says what it passed over and
# why: WGPU here with its Vulkan driver hidden (the loader finds no driver manifest).
NO_VULKAN=(env VK_ICD_FILENAMES=/nonexistent.json VK_DRIVER_FILES=/nonexistent.json)
if "${NO_VULKAN[@]}" "${W[0]}" --backend wgpu "${W[@]:3}" --max-steps 1 --out "$OUT/no-vulkan" > "$OUT/no-vulkan.log" 2>&1; then
    fail "--backend wgpu without a Vulkan driver was accepted"
fi
grep -q 'WGPU found no usable adapter' "$OUT/no-vulkan.log" && grep -q 'install a Vulkan driver' "$OUT/no-vulkan.log" \
    || fail "--backend wgpu without a driver:"$'\n'"$(cat "$OUT/no-vulkan.log")"
"${NO_VULKAN[@]}" "${W[0]}" --backend auto "${W[@]:3}" --max-steps 1 --out "$OUT/auto" > "$OUT/auto.log" 2>&1 \
    || fail "--backend auto without a Vulkan driver failed:"$'\n'"$(cat "$OUT/auto.log")"
for said in 'backend auto: not CUDA: ' 'backend auto: not WGPU: WGPU found no usable adapter' \
    'backend auto: choosing Flex'; do
    grep -q "$said" "$OUT/auto.log" || fail "--backend auto did not say '$said':"$'\n'"$(cat "$OUT/auto.log")"
done
echo "program_checks: a backend that does not start says why; auto says what it passed over"

# --resume into a folder that holds something else and no run: refused like a fresh run, and the
# user's files stay as they were.
mkdir -p "$OUT/mine"
echo "mine" > "$OUT/mine/metrics.csv"
if "${W[@]}" --max-steps 2 --out "$OUT/mine" --resume > "$OUT/mine.log" 2>&1; then
    fail "--resume into a folder of someone else's files was accepted"
fi
grep -q 'is not empty and holds no run' "$OUT/mine.log" \
    || fail "--resume into a foreign folder:"$'\n'"$(cat "$OUT/mine.log")"
[ "$(cat "$OUT/mine/metrics.csv")" = "mine" ] || fail "--resume overwrote the user's metrics.csv"
echo "program_checks: --resume into a folder with no run is refused and keeps its files"

# A resume with a new --max-steps keeps the run's derived warmup instead of refusing the resume.
SMALL=(--seq-len 64 --batch-size 4 --checkpoint-every 2 --out "$OUT/x")
"${W[@]}" "${SMALL[@]}" --max-steps 6 --stop-at 4 > "$OUT/x-first.log" 2>&1 \
    || fail "the first 4 steps failed:"$'\n'"$(cat "$OUT/x-first.log")"
"${W[@]}" "${SMALL[@]}" --max-steps 8 --resume > "$OUT/x-resume.log" 2>&1 \
    || fail "the resume with --max-steps 8 failed:"$'\n'"$(cat "$OUT/x-resume.log")"
grep -q "resuming with the run's 3 warmup steps" "$OUT/x-resume.log" \
    || fail "the resume did not say it keeps the warmup:"$'\n'"$(cat "$OUT/x-resume.log")"
grep -Eq '"val_step": *8' "$OUT/x/summary.json" || fail "the resumed run did not reach step 8"
echo "program_checks: a resume with a new --max-steps keeps the run's warmup"

# More tokens asked for than the context holds: a note, then generation to the context's end.
"$BIN/generate" --run "$OUT/x" --prompt "ROMEO:" --max-new-tokens 1000 --temperature 0 \
    --no-compare > "$OUT/gen.out" 2> "$OUT/gen.log" || fail "generate failed:"$'\n'"$(cat "$OUT/gen.log")"
grep -q 'note: --max-new-tokens 1000: .* room for 251 more' "$OUT/gen.log" \
    || fail "generate did not note the context cap:"$'\n'"$(cat "$OUT/gen.log")"
grep -q '^251 tokens in' "$OUT/gen.log" || fail "generate did not stop at the context's end"
echo "program_checks: generate notes and honours the context cap"

# Every experiment file is a valid command of its program (nothing is trained: --print-command).
for file in experiments/*.toml; do
    program="$(sed -n 's/^program *= *"\([a-z0-9_]*\)".*/\1/p' "$file")"
    [ -x "$BIN/$program" ] || fail "$file: no program \`$program\` among the built examples"
    "$BIN/$program" "$file" --print-command > "$OUT/experiment.log" 2>&1 \
        || fail "$file does not parse:"$'\n'"$(cat "$OUT/experiment.log")"
done
echo "program_checks: every experiment file parses for its program"
# A typo in an experiment file names the file and the key.
printf 'program = "ablations"\nmax_step = 10\n' > "$OUT/typo.toml"
if "$BIN/ablations" "$OUT/typo.toml" > "$OUT/typo.log" 2>&1; then fail "a typo was accepted"; fi
grep -q 'typo.toml: `max_step` is not a flag of `ablations`' "$OUT/typo.log" \
    || fail "the typo's message:"$'\n'"$(cat "$OUT/typo.log")"
echo "program_checks: a typo in an experiment file is refused naming the file and the key"
# An on/off key takes only a TOML boolean: "false" (a string) or 0 would have turned it on.
for value in '"false"' 0; do
    printf 'program = "ablations"\nretry_failed = %s\n' "$value" > "$OUT/switch.toml"
    if "$BIN/ablations" "$OUT/switch.toml" --list-cells > "$OUT/switch.log" 2>&1; then
        fail "retry_failed = $value was accepted"
    fi
    grep -q 'switch.toml: `retry_failed` = .*takes only a TOML boolean' "$OUT/switch.log" \
        || fail "retry_failed = $value:"$'\n'"$(cat "$OUT/switch.log")"
done
# The reproduction: `force = "false"` in a file used to overwrite a non-empty folder.
mkdir -p "$OUT/kept"
echo "mine" > "$OUT/kept/metrics.csv"
printf 'program = "wikitext_60m"\nforce = "false"\n' > "$OUT/force.toml"
if "${W[@]}" "$OUT/force.toml" --max-steps 2 --out "$OUT/kept" > "$OUT/force.log" 2>&1; then
    fail "force = \"false\" was accepted"
fi
grep -q 'force.toml: `force` = "false": `--force` is an on/off flag' "$OUT/force.log" \
    || fail "force = \"false\":"$'\n'"$(cat "$OUT/force.log")"
[ "$(cat "$OUT/kept/metrics.csv")" = "mine" ] || fail "force = \"false\" overwrote metrics.csv"
# A negative number reaches the flag's own check instead of becoming clap's advice on `-- -5`.
printf 'program = "ablations"\nmax_steps = -5\n' > "$OUT/negative.toml"
if "$BIN/ablations" "$OUT/negative.toml" --list-cells > "$OUT/negative.log" 2>&1; then
    fail "max_steps = -5 was accepted"
fi
grep -q "invalid value '-5' for '--max-steps" "$OUT/negative.log" \
    || fail "max_steps = -5:"$'\n'"$(cat "$OUT/negative.log")"
echo "program_checks: experiment files turn flags on only with true, and negative numbers are named"
# The benchmark refuses what would give an empty table or a panic.
for args in "--reps 0" "--only bogus" "--variants bogus"; do
    # shellcheck disable=SC2086 # the words of each case
    if "$BIN/train_step_bench" --backend flex $args > "$OUT/bench.log" 2>&1; then
        fail "train_step_bench $args was accepted"
    fi
    grep -Eq "invalid value '0'|no configuration of this benchmark|no attention variant" \
        "$OUT/bench.log" || fail "train_step_bench $args:"$'\n'"$(cat "$OUT/bench.log")"
done
echo "program_checks: train_step_bench refuses zero reps and unknown names"
