#!/usr/bin/env python3
"""PyTorch eager (CPU) training step of the GPT shapes that `train_step_bench` trains.

The model is the crate's `Gpt` with standard attention (src/model/gpt.rs, src/model/config.rs):
token embedding + learned position embedding (one row per position of the context, here the
sequence length), `n_layers` pre-norm blocks `x = x + attn(ln1(x)); x = x + mlp(ln2(x))`,
a final LayerNorm and an LM head tied to the token embedding. Every step draws fresh random
inputs and targets, computes the cross-entropy of the full `[tokens, vocab]` logits, runs the
backward pass and one AdamW step. Prints one JSON line on stdout; progress goes to stderr.

    python3 benches/vs_pytorch/torch_gpt.py --shape torch-small --attention sdpa
"""

import argparse
import json
import math
import sys
import time
import warnings

# This CPU benchmark needs no NumPy; silence torch's note when it is not installed.
warnings.filterwarnings("ignore", message="Failed to initialize NumPy")

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

# name: (d_model, n_layers, n_heads, seq, batch, vocab); the context (positions) is `seq`.
SHAPES = {
    "tiny": (128, 4, 4, 256, 16, 256),
    "torch-small": (128, 4, 4, 128, 16, 512),
    "torch-medium": (256, 4, 4, 256, 8, 8192),
    "long": (128, 4, 4, 1024, 4, 256),
    "60m": (576, 8, 9, 512, 8, 50257),
}

INIT_STD = 0.02
# Burn's `AdamWConfig::new()`, which the crate's benchmark uses: betas (0.9, 0.999),
# epsilon 1e-5 (PyTorch's default is 1e-8; it changes no timing), weight decay 1e-4.
ADAMW = dict(lr=1e-4, betas=(0.9, 0.999), eps=1e-5, weight_decay=1e-4)


class Attention(nn.Module):
    def __init__(self, d, n_heads, context, kind):
        super().__init__()
        assert d % n_heads == 0, "d_model must split into the heads"
        self.n_heads, self.d_head, self.kind = n_heads, d // n_heads, kind
        self.query = nn.Linear(d, d)
        self.key = nn.Linear(d, d)
        self.value = nn.Linear(d, d)
        self.output = nn.Linear(d, d)
        if kind == "explicit":
            mask = torch.ones(context, context, dtype=torch.bool).triu(1)  # True above the diagonal
            self.register_buffer("future", mask, persistent=False)

    def forward(self, x):  # [b, t, d]
        b, t, d = x.shape
        split = lambda y: y.view(b, t, self.n_heads, self.d_head).transpose(1, 2)  # [b, h, t, dh]
        q, k, v = split(self.query(x)), split(self.key(x)), split(self.value(x))
        if self.kind == "sdpa":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            scores = q @ k.transpose(-2, -1) / math.sqrt(self.d_head)  # [b, h, t, t]
            scores = scores.masked_fill(self.future[:t, :t], float("-inf"))
            y = scores.softmax(dim=-1) @ v  # the [b, h, t, t] weights are materialised
        return self.output(y.transpose(1, 2).reshape(b, t, d))


class Block(nn.Module):
    def __init__(self, d, n_heads, context, kind):
        super().__init__()
        self.ln1 = nn.LayerNorm(d, eps=1e-5)
        self.attn = Attention(d, n_heads, context, kind)
        self.ln2 = nn.LayerNorm(d, eps=1e-5)
        self.up = nn.Linear(d, 4 * d)
        self.down = nn.Linear(4 * d, d)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.down(F.gelu(self.up(self.ln2(x))))  # exact (erf) GELU


class Gpt(nn.Module):
    def __init__(self, vocab, d, n_layers, n_heads, context, kind):
        super().__init__()
        self.tokens = nn.Embedding(vocab, d)
        self.positions = nn.Embedding(context, d)
        self.blocks = nn.ModuleList(Block(d, n_heads, context, kind) for _ in range(n_layers))
        self.norm = nn.LayerNorm(d, eps=1e-5)
        # The crate's initialisation (Burn's `LinearConfig` initialises the bias with the
        # weight's initializer, so biases are N(0, std) too, not zero). LayerNorms: γ 1, β 0.
        residual_std = INIT_STD / math.sqrt(2 * n_layers)
        nn.init.normal_(self.tokens.weight, std=INIT_STD)
        nn.init.normal_(self.positions.weight, std=INIT_STD)
        for block in self.blocks:
            for linear, std in [
                (block.attn.query, INIT_STD),
                (block.attn.key, INIT_STD),
                (block.attn.value, INIT_STD),
                (block.attn.output, residual_std),
                (block.up, INIT_STD),
                (block.down, residual_std),
            ]:
                nn.init.normal_(linear.weight, std=std)
                nn.init.normal_(linear.bias, std=std)

    def forward(self, idx):  # [b, t] → [b, t, vocab]
        t = idx.shape[1]
        x = self.tokens(idx) + self.positions(torch.arange(t, device=idx.device))
        for block in self.blocks:
            x = block(x)
        return F.linear(self.norm(x), self.tokens.weight)  # tied head, no bias


def proc_status_bytes(field):
    """A `kB` field of /proc/self/status (VmRSS, VmHWM) in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", choices=sorted(SHAPES), default="torch-small")
    p.add_argument("--attention", choices=["sdpa", "explicit"], default="sdpa")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    if args.reps < 1:
        p.error("--reps must be at least 1")

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    d, n_layers, n_heads, seq, batch, vocab = SHAPES[args.shape]
    model = Gpt(vocab, d, n_layers, n_heads, seq, args.attention)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), **ADAMW)
    params = sum(p.numel() for p in model.parameters())

    def step():
        inputs = torch.randint(0, vocab, (batch, seq))
        targets = torch.randint(0, vocab, (batch, seq))
        start = time.perf_counter()
        logits = model(inputs)
        loss = F.cross_entropy(logits.view(-1, vocab), targets.view(-1))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return time.perf_counter() - start, loss.item()

    # Memory as the crate's side counts it: resident set right before the first (warm-up) step,
    # and the process's peak resident set after the last one. The difference includes the AdamW
    # state (two moments per parameter), created lazily in the first step; the crate's optimiser
    # state is likewise created in its first step.
    rss_before = proc_status_bytes("VmRSS")
    for i in range(args.warmup):
        secs, loss = step()
        print(f"warmup {i + 1}/{args.warmup}: {secs:.3f} s, loss {loss:.4f}", file=sys.stderr)
    times = []
    for i in range(args.reps):
        secs, loss = step()
        times.append(secs)
        print(f"rep {i + 1}/{args.reps}: {secs:.3f} s, loss {loss:.4f}", file=sys.stderr)
    peak = proc_status_bytes("VmHWM")

    median = sorted(times)[len(times) // 2]  # the crate's median: the upper one of an even count
    print(json.dumps({
        "tool": "pytorch",
        "torch_version": torch.__version__,
        "shape": args.shape,
        "attention": args.attention,
        "threads": args.threads,
        "batch": batch,
        "seq": seq,
        "vocab": vocab,
        "d_model": d,
        "n_layers": n_layers,
        "n_heads": n_heads,
        "params": params,
        "warmup": args.warmup,
        "reps": args.reps,
        "step_s_median": median,
        "step_s": times,
        "tokens_per_s": batch * seq / median,
        "rss_before_first_step_bytes": rss_before,
        "peak_rss_bytes": peak,
        "step_rss_bytes": peak - rss_before,
    }))


if __name__ == "__main__":
    main()
