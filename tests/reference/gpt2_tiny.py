"""Reference fixture for loading GPT-2-layout safetensors: a tiny random GPT-2 and its logits.

Writes tests/fixtures/gpt2-tiny/ (model.safetensors, config.json, generation_config.json,
logits.json; see README.md there):
a random transformers GPT2LMHeadModel (vocab 256, the byte tokenizer's, so that the harness
can fine-tune it; 32 positions, n_embd 64, 2 layers, 2 heads, gelu_new, eps 1e-5, no dropout) in float32, and its logits for one fixed [2, 12] input.
Every parameter, biases and LayerNorm weights/biases included, is overwritten with random
values after construction (GPT-2's own init makes biases 0 and LayerNorm weights 1, which
would hide a loader that skips them).

Run: python tests/reference/gpt2_tiny.py   (from the repository root)
Made with: Python 3.11.7, torch 2.15.0+cu132 (the PyPI wheel, run on CPU), transformers 5.25.0,
safetensors 0.8.0, numpy 2.4.6, in a virtualenv: pip install torch transformers safetensors numpy.
Re-running with these versions reproduces the four files byte for byte.
The script also re-computes the logits in plain numpy from model.safetensors alone, with
the math README.md documents, and fails if they differ from transformers' by more than 1e-5.
"""
import json
import math
import os
import sys

import numpy as np
import safetensors
import torch
import transformers
from safetensors.numpy import load_file
from transformers import GPT2Config, GPT2LMHeadModel

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "tests", "fixtures", "gpt2-tiny")
BATCH, SEQ = 2, 12
PARAM_SEED = 1234

config = GPT2Config(
    vocab_size=256,
    n_positions=32,
    n_embd=64,
    n_layer=2,
    n_head=2,
    activation_function="gelu_new",
    layer_norm_epsilon=1e-5,
    resid_pdrop=0.0,
    embd_pdrop=0.0,
    attn_pdrop=0.0,
)
config._attn_implementation = "eager"  # plain matmul/softmax path, no SDPA kernel choice

torch.manual_seed(0)
model = GPT2LMHeadModel(config).to(torch.float32).eval()
assert model.lm_head.weight is model.transformer.wte.weight, "lm_head expected tied to wte"

# Overwrite every parameter (named_parameters lists the tied wte/lm_head tensor once) so that
# none is 0 or 1: weights, biases, embeddings ~ N(0, 0.2); LayerNorm weights 1 + 0.1 N(0, 1).
gen = torch.Generator().manual_seed(PARAM_SEED)
with torch.no_grad():
    for name, p in model.named_parameters():
        noise = torch.randn(p.shape, generator=gen, dtype=torch.float32)
        if ".ln_" in name and name.endswith(".weight"):
            p.copy_(1.0 + 0.1 * noise)
        else:
            p.copy_(0.2 * noise)

# Fixed input: an affine pattern per row.
input_ids = torch.tensor(
    [[(7 * t + 31 * b + 3) % config.vocab_size for t in range(SEQ)] for b in range(BATCH)],
    dtype=torch.long,
)
with torch.no_grad():
    logits = model(input_ids).logits.to(torch.float32)
assert tuple(logits.shape) == (BATCH, SEQ, config.vocab_size)

os.makedirs(OUT, exist_ok=True)
model.save_pretrained(OUT, safe_serialization=True)
for extra in ("generation_config.json",):
    path = os.path.join(OUT, extra)
    if os.path.exists(path) and os.path.getsize(path) > 4096:
        os.remove(path)


def f32(x):
    # Shortest decimal that reads back as the same float32.
    return float(str(np.float32(x)))


with open(os.path.join(OUT, "logits.json"), "w") as fh:
    json.dump(
        {
            "input_ids": input_ids.tolist(),
            "logits": [[[f32(v) for v in row] for row in seq] for seq in logits.numpy()],
            "shape": list(logits.shape),
            "transformers": transformers.__version__,
            "torch": torch.__version__,
        },
        fh,
    )
    fh.write("\n")

# What the file holds.
with safetensors.safe_open(os.path.join(OUT, "model.safetensors"), "np") as st:
    print("metadata:", st.metadata())
    for key in sorted(st.keys()):
        t = st.get_slice(key)
        print(f"{key} {list(t.get_shape())} {t.get_dtype()}")

# Independent check: the documented GPT-2 math in numpy, from the safetensors file only.
W = {k: v.astype(np.float64) for k, v in load_file(os.path.join(OUT, "model.safetensors")).items()}
pre = "transformer." if "transformer.wte.weight" in W else ""
E, H, L = config.n_embd, config.n_head, config.n_layer
D = E // H


def layer_norm(x, w, b, eps=config.layer_norm_epsilon):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)  # biased variance
    return (x - mu) / np.sqrt(var + eps) * w + b


def gelu_new(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


ids = input_ids.numpy()
x = W[pre + "wte.weight"][ids] + W[pre + "wpe.weight"][np.arange(SEQ)][None]
causal = np.triu(np.full((SEQ, SEQ), -np.inf), k=1)
for i in range(L):
    p = f"{pre}h.{i}."
    h = layer_norm(x, W[p + "ln_1.weight"], W[p + "ln_1.bias"])
    qkv = h @ W[p + "attn.c_attn.weight"] + W[p + "attn.c_attn.bias"]  # Conv1D: x @ W[in, out] + b
    q, k, v = (a.reshape(BATCH, SEQ, H, D).transpose(0, 2, 1, 3) for a in np.split(qkv, 3, axis=-1))
    s = q @ k.transpose(0, 1, 3, 2) / math.sqrt(D) + causal
    a = np.exp(s - s.max(-1, keepdims=True))
    a /= a.sum(-1, keepdims=True)
    o = (a @ v).transpose(0, 2, 1, 3).reshape(BATCH, SEQ, E)
    x = x + o @ W[p + "attn.c_proj.weight"] + W[p + "attn.c_proj.bias"]
    h = layer_norm(x, W[p + "ln_2.weight"], W[p + "ln_2.bias"])
    m = gelu_new(h @ W[p + "mlp.c_fc.weight"] + W[p + "mlp.c_fc.bias"])
    x = x + m @ W[p + "mlp.c_proj.weight"] + W[p + "mlp.c_proj.bias"]
x = layer_norm(x, W[pre + "ln_f.weight"], W[pre + "ln_f.bias"])
lm_head = W.get("lm_head.weight", W[pre + "wte.weight"])  # [vocab, n_embd]; tied, no bias
ref = x @ lm_head.T
err = np.abs(ref - logits.numpy()).max()
print(f"logits shape {list(logits.shape)}, |logits| max {np.abs(ref).max():.3f}, "
      f"std {ref.std():.3f}; numpy re-implementation max abs diff {err:.2e}")
if err > 1e-5:
    sys.exit("numpy re-implementation disagrees with transformers")
print("wrote", OUT, sorted(os.listdir(OUT)))
