"""Reference values for tests/integrators.rs, computed without the crate (plain Python floats).

Run: python3 tests/reference/integrators.py
The coupling net is f(q) = silu(q·W1 + b1)·W2 + b2 (row vectors, Burn's Linear layout).
"""
import math

W1 = [[0.5, -0.3], [0.2, 0.8]]
B1 = [0.1, -0.2]
W2 = [[1.0, -0.5], [0.3, 0.7]]
B2 = [0.05, -0.1]
DT = 0.25
TOKENS = [([0.4, -0.7], [0.2, 0.9]), ([-1.2, 0.3], [0.5, -0.4])]


def silu(x):
    return x / (1.0 + math.exp(-x))


def f(q):
    h = [silu(sum(q[i] * W1[i][j] for i in range(2)) + B1[j]) for j in range(2)]
    return [sum(h[i] * W2[i][j] for i in range(2)) + B2[j] for j in range(2)]


def axpy(a, x, y):
    return [yi + a * xi for xi, yi in zip(x, y)]


def euler(q, k):
    return axpy(DT, k, q), axpy(DT, f(q), k)


def leapfrog(q, k):
    k = axpy(DT / 2, f(q), k)
    q = axpy(DT, k, q)
    return q, axpy(DT / 2, f(q), k)


for name, step in [("euler", euler), ("leapfrog", leapfrog)]:
    for steps in (1, 2):
        out = []
        for q, k in TOKENS:
            for _ in range(steps):
                q, k = step(q, k)
            out.append((q, k))
        print(f"{name} x{steps}")
        for q, k in out:
            print(f"  q = [{q[0]:.9f}, {q[1]:.9f}]  k = [{k[0]:.9f}, {k[1]:.9f}]")
