"""The Leviathan et al. (2023) speedup bound for speculative decoding (pure; no dependencies).

With per-token acceptance a (i.i.d.), draft length k and draft/target cost ratio c, one verify
step yields (1 - a^(k+1)) / (1 - a) tokens on average and costs k*c + 1 target steps.
best_k picks the draft length that maximises that bound: for speed, not for acceptance.
"""

from __future__ import annotations

K_MAX = 8  # the longest draft best_k considers (EAGLE-3 servers run k of 1 to about 8)


def expected_tokens(a: float, k: int) -> float:
    """Expected tokens per verify step with i.i.d. acceptance a and k drafts (bonus included)."""
    if not 0.0 <= a <= 1.0:
        raise ValueError(f"acceptance {a} is not a probability")
    if a == 1.0:
        return float(k + 1)
    return (1.0 - a ** (k + 1)) / (1.0 - a)


def leviathan_speedup(a: float, k: int, c: float) -> float:
    """Upper bound on the speedup over plain decoding: expected_tokens(a, k) / (k*c + 1)."""
    if c < 0:
        raise ValueError(f"cost ratio {c} is negative")
    return expected_tokens(a, k) / (k * c + 1.0)


def acceptance_from_accept_len(accept_len: float, k: int, tol: float = 1e-10) -> float:
    """The i.i.d. per-token acceptance a with expected_tokens(a, k) == accept_len (bisection)."""
    if not 1.0 <= accept_len <= k + 1 + 1e-9:
        raise ValueError(f"accept_len {accept_len} is outside [1, {k + 1}] for k={k}")
    lo, hi = 0.0, 1.0
    while hi - lo > tol:
        mid = (lo + hi) / 2
        if expected_tokens(mid, k) < accept_len:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def best_k(a: float, c: float, k_max: int = K_MAX) -> tuple[int, float]:
    """The draft length k in 1..k_max that maximises leviathan_speedup(a, k, c), and that bound.

    Ties go to the shorter draft (it wastes less when acceptance falls). With c == 0 drafting is
    free and the bound rises with k while a > 0; with a == 0 every k yields one token, the shortest
    costs least. A bound below 1 at best_k means no k pays for its drafting at this a and c.
    """
    if k_max < 1:
        raise ValueError(f"k_max {k_max} is below 1")
    best, bound = 1, leviathan_speedup(a, 1, c)
    for k in range(2, k_max + 1):
        s = leviathan_speedup(a, k, c)
        if s > bound * (1 + 1e-12):
            best, bound = k, s
    return best, bound
