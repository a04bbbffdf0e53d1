#!/usr/bin/env python3
"""Markdown table of a `run.sh` directory: the crate's training step against PyTorch's.

    python3 benches/vs_pytorch/report.py runs/vs_pytorch

Reads `crate-<shape>-<kernel>.json` (train_step_bench) and `torch-<shape>-<attention>.json`
(torch_gpt.py), prints the table and writes it to `<dir>/report.md`. Step memory on both sides is
the peak resident set after the last step minus the resident set before the first step.
"""

import datetime
import json
import os
import platform
import re
import sys
from pathlib import Path

MIB = 1 << 20
# The order of run.sh's defaults; other shapes follow alphabetically.
SHAPE_ORDER = ["tiny", "torch-small", "torch-medium", "long", "60m"]
KERNEL_ORDER = ["explicit", "flash"]


def load(path, notes):
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        notes.append(f"missing: `{path.name}`")
    except (json.JSONDecodeError, OSError) as e:
        notes.append(f"unreadable: `{path.name}` ({e})")
    return None


def crate_figures(data):
    """tokens/s and step RSS bytes of a train_step_bench JSON (its first row)."""
    row = data["rows"][0]
    step_rss = data["peak_rss_bytes"] - data["rss_before_first_step_bytes"]
    return row["tokens_per_s"], step_rss


def fmt(x, digits=0):
    return "–" if x is None else f"{x:,.{digits}f}"


def ratio(a, b):
    return None if a is None or b is None or b == 0 else a / b


def order(items, preferred):
    return sorted(items, key=lambda s: (preferred.index(s) if s in preferred else len(preferred), s))


def main():
    if len(sys.argv) != 2:
        sys.exit(f"usage: {sys.argv[0]} OUT_DIR")
    out = Path(sys.argv[1])
    if not out.is_dir():
        sys.exit(f"error: {out} is not a directory")

    crate_files, torch_shapes = {}, set()
    for p in out.glob("*.json"):
        if m := re.fullmatch(r"crate-(.+)-([a-z0-9]+)\.json", p.name):
            crate_files[(m[1], m[2])] = p
        elif m := re.fullmatch(r"torch-(.+)-(sdpa|explicit)\.json", p.name):
            torch_shapes.add(m[1])
    shapes = order({s for s, _ in crate_files} | torch_shapes, SHAPE_ORDER)
    # The kernels any shape was run with (else run.sh's defaults): a shape without one is noted.
    all_kernels = order({k for _, k in crate_files}, KERNEL_ORDER) or KERNEL_ORDER

    notes, rows = [], []
    torch_version = backend = None
    for shape in shapes:
        sdpa = load(out / f"torch-{shape}-sdpa.json", notes)
        explicit = load(out / f"torch-{shape}-explicit.json", notes)
        torch_version = torch_version or next(
            (t["torch_version"] for t in (sdpa, explicit) if t), None
        )
        sdpa_tps = sdpa["tokens_per_s"] if sdpa else None
        sdpa_rss = sdpa["step_rss_bytes"] if sdpa else None
        explicit_tps = explicit["tokens_per_s"] if explicit else None
        kernels = order([k for s, k in crate_files if s == shape], KERNEL_ORDER)
        notes += [f"missing: `crate-{shape}-{k}.json`" for k in all_kernels if k not in kernels]
        kernels = kernels or [None]
        for kernel in kernels:
            crate_tps = crate_rss = None
            if kernel is not None:
                data = load(crate_files[(shape, kernel)], notes)
                if data:
                    backend = backend or data.get("backend")
                    try:
                        crate_tps, crate_rss = crate_figures(data)
                    except (KeyError, IndexError, TypeError) as e:
                        notes.append(f"`{crate_files[(shape, kernel)].name}`: no figure {e}")
            rows.append([
                shape,
                kernel or "–",
                fmt(crate_tps),
                fmt(sdpa_tps),
                fmt(ratio(crate_tps, sdpa_tps), 2),
                fmt(explicit_tps),
                fmt(None if crate_rss is None else crate_rss / MIB, 1),
                fmt(None if sdpa_rss is None else sdpa_rss / MIB, 1),
                fmt(ratio(crate_rss, sdpa_rss), 2),
            ])

    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        f"{now} · {platform.machine()} · nproc {len(os.sched_getaffinity(0))} · "
        f"torch {torch_version or '?'} · crate backend {backend or '?'}",
        "",
        "| shape | crate kernel | crate tokens/s | PyTorch SDPA tokens/s | ratio (crate ÷ SDPA) "
        "| PyTorch explicit tokens/s | crate step RSS MiB | PyTorch SDPA step RSS MiB "
        "| memory ratio |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    if not rows:
        lines.append("(no results)")
    lines += [
        "",
        "Step RSS: peak resident set after the last step minus the resident set before the first "
        "(warm-up) step; it includes the optimiser state created in the first step.",
    ]
    if notes:
        lines += [""] + [f"- {n}" for n in notes]
    text = "\n".join(lines) + "\n"
    print(text, end="")
    (out / "report.md").write_text(text)


if __name__ == "__main__":
    main()
