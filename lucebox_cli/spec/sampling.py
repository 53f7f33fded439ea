"""Token sampling: temperature, then top-k, then top-p (the order HF transformers applies them).

`probs()` returns the exact distribution `sample()` draws from, so speculative verification can
accept/reject against the same distribution (and a draft can use the same warping). Temperature 0
means greedy: the distribution is one-hot on the first argmax.
"""

from __future__ import annotations

import numpy as np

from lucebox_cli.errors import UsageError


def check_params(temperature: float, top_k: int, top_p: float) -> None:
    if temperature < 0 or top_k < 0 or not 0.0 < top_p <= 1.0:
        raise UsageError(
            f"bad sampling parameters: temperature={temperature}, top_k={top_k}, top_p={top_p}",
            hint="temperature >= 0 (0 = greedy), top_k >= 0 (0 = off), 0 < top_p <= 1 (1 = off)",
        )


def probs(logits: np.ndarray, temperature: float, top_k: int = 0, top_p: float = 1.0) -> np.ndarray:
    """[V] float64 distribution after temperature, top-k and top-p; sums to 1."""
    check_params(temperature, top_k, top_p)
    logits = np.asarray(logits, dtype=np.float64).reshape(-1)
    out = np.zeros_like(logits)
    if temperature == 0:
        out[int(np.argmax(logits))] = 1.0
        return out
    z = logits / temperature
    keep = np.isfinite(z)
    if 0 < top_k < z.size:
        # Ties at the k-th value are all kept, as HF's `logits < kth_value` filter does.
        kth = np.partition(z, -top_k)[-top_k]
        keep &= z >= kth
    idx = np.flatnonzero(keep)
    p = np.exp(z[idx] - z[idx].max())
    p /= p.sum()
    if top_p < 1.0:
        order = np.argsort(-p, kind="stable")
        before = np.cumsum(p[order]) - p[order]  # mass strictly ahead of each token
        # Keep the smallest prefix whose mass reaches top_p (always at least the top token).
        chosen = order[before < top_p]
        q = np.zeros_like(p)
        q[chosen] = p[chosen]
        p = q / q.sum()
    out[idx] = p
    return out


def sample(
    logits: np.ndarray, temperature: float, top_k: int = 0, top_p: float = 1.0, rng: np.random.Generator | None = None
) -> int:
    """Draw one token id; greedy (no randomness consumed) when temperature == 0."""
    if temperature == 0:
        check_params(temperature, top_k, top_p)
        return int(np.argmax(logits))
    if rng is None:
        raise UsageError("sampling with temperature > 0 needs an rng (np.random.default_rng(seed))")
    return draw(probs(logits, temperature, top_k, top_p), rng)


def draw(p: np.ndarray, rng: np.random.Generator) -> int:
    """Inverse-CDF draw from a distribution (one uniform per call, so streams replay with a seed)."""
    cdf = np.cumsum(p)
    return int(min(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"), p.size - 1))
