"""Reference values for tests/affine.rs, computed without the crate (plain Python floats).

Run: python3 tests/reference/affine.py
Each layer applies k <- k * exp(s1(q)) + t1(q), then q <- q * exp(s2(k)) + t2(k), with
s = B * tanh(net(x) / B), B = 2, and every net net(x) = silu(x W1 + b1) W2 + b2 (row vectors,
Burn's Linear layout). The log-determinant is the sum of every s1 and s2.
"""
import math

B = 2.0
D, H = 2, 2
TOKENS = [([0.4, -0.7], [0.2, 0.9]), ([-1.2, 0.3], [0.5, -0.4])]


def weights(index):
    """The weights of net `index` (0..7: layer 0's s1, t1, s2, t2, then layer 1's), in the order
    w1 [D, H], b1 [H], w2 [H, D], b2 [D]; a smooth formula so the Rust test can rebuild them."""
    n = 2 * D * H + H + D
    return [0.6 * math.sin(1.7 * (index * n + i) + 0.3) for i in range(n)]


def silu(x):
    return x / (1.0 + math.exp(-x))


def net(index, x):
    w = weights(index)
    w1, b1 = w[: D * H], w[D * H : D * H + H]
    w2, b2 = w[D * H + H : 2 * D * H + H], w[2 * D * H + H :]
    h = [silu(sum(x[i] * w1[i * H + j] for i in range(D)) + b1[j]) for j in range(H)]
    return [sum(h[i] * w2[i * D + j] for i in range(H)) + b2[j] for j in range(D)]


def log_scale(index, x):
    return [B * math.tanh(v / B) for v in net(index, x)]


def forward(q, k, layers):
    log_det = 0.0
    for layer in range(layers):
        s1 = log_scale(4 * layer, q)
        t1 = net(4 * layer + 1, q)
        k = [k[i] * math.exp(s1[i]) + t1[i] for i in range(D)]
        s2 = log_scale(4 * layer + 2, k)
        t2 = net(4 * layer + 3, k)
        q = [q[i] * math.exp(s2[i]) + t2[i] for i in range(D)]
        log_det += sum(s1) + sum(s2)
    return q, k, log_det


for layers in (1, 2):
    print(f"affine x{layers}")
    for q, k in TOKENS:
        q, k, log_det = forward(q, k, layers)
        print(f"  q = [{q[0]:.9f}, {q[1]:.9f}]  k = [{k[0]:.9f}, {k[1]:.9f}]  log_det = {log_det:.9f}")
