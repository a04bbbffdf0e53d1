#!/usr/bin/env bash
# Copies the record of every finished run under a runs folder (config.json, summary.json,
# metrics.csv, dynamics.csv and the plots; not the checkpoints) into a folder of the same layout,
# by default results/<name of the runs folder's parent>/runs. The suite programs read a finished
# run back instead of training it, so copying a kept folder back under runs/ lets a suite on a
# fresh clone report, or go on with the cells still missing, without training the kept ones again:
#
#   scripts/keep_runs.sh runs/long-cpu/runs                # runs/long-cpu/runs -> results/long-cpu/runs
#   mkdir -p runs && cp -r results/long-cpu runs/          # and back
#
# Runs whose summary.json does not say finished (interrupted or failed ones) are left out. Files are written through a
# temporary name and renamed, so an interrupted copy never leaves a truncated file behind.
set -euo pipefail
cd "$(dirname "$0")/.."

fail() { echo "keep_runs: $*" >&2; exit 1; }
[ $# -ge 1 ] && [ $# -le 2 ] || fail "usage: scripts/keep_runs.sh RUNS_DIR [DEST] (e.g. runs/long-cpu/runs)"
src="${1%/}"
[ -d "$src" ] || fail "$src is not a folder: give the --runs-dir of a suite program"
dest="${2:-results/$(basename "$(dirname "$src")")/runs}"

kept=0
while IFS= read -r summary; do
  grep -Eq '"finished": *true' "$summary" || continue
  run="$(dirname "$summary")"
  out="$dest/${run#"$src"/}"
  mkdir -p "$out"
  for file in config.json summary.json metrics.csv dynamics.csv attention.csv loss.svg dynamics.svg attention.svg; do
    [ -f "$run/$file" ] || continue
    cp "$run/$file" "$out/.$file.tmp"
    mv "$out/.$file.tmp" "$out/$file"
  done
  kept=$((kept + 1))
done < <(find "$src" -name summary.json -not -path '*/checkpoints/*' | sort)
echo "keep_runs: $kept finished runs from $src kept in $dest"
# A kept record that git ignores would be lost with the checkout: say so instead of failing quietly.
if [ "$kept" -gt 0 ] && git rev-parse --is-inside-work-tree >/dev/null 2>&1 \
  && git check-ignore -q "$(find "$dest" -name summary.json | head -n 1)" 2>/dev/null; then
  echo "keep_runs: warning: git ignores $dest (see .gitignore): commit will not include it" >&2
fi
