"""Speculative decoding at the production sampler: temperature / top-p / top-k and the standard
rejection-sampling acceptance rule (Leviathan et al. 2023; Chen et al. 2023), in one home for both
decoders (eagle/decode/fast.py and eagle/decode/generic.py).

Verify with drafts x_1..x_k, target distributions p_0..p_k (after temperature and top-k / top-p)
and draft distributions q_1..q_k:
- accept x_j with probability min(1, p_{j-1}(x_j) / q_j(x_j)), in order, until the first reject;
- on a reject at j, the next token is drawn from the normalised residual max(0, p_{j-1} - q_j);
- when all k are accepted, the bonus token is drawn from p_k.
The output is distributed exactly as sampling from the target alone.

The drafts are the drafter's argmax (q one-hot), as vLLM proposes EAGLE-3 drafts by default
(vllm/config/speculative.py `draft_sample_method = "greedy"`, the only choice with a draft
vocabulary; vllm/v1/sample/rejection_sampler.py then sets q(x) = 1): the rule reduces to "accept
x_j with probability p_{j-1}(x_j); on a reject, draw from p_{j-1} with x_j removed". `verify`
takes general draft probabilities too (tests/eagle/decode/test_sampling.py checks the output
distribution).

Reproducible: every random draw comes from the Sampler's own torch.Generator, seeded per prompt
(`eagle evaluate --seed`), and one verify step draws the same count of numbers whatever it accepts.
Temperature 0 never reaches this module: greedy decoding keeps its argmax path untouched.
"""

from __future__ import annotations

import torch

from eagle.serving.client import Sampling


def check_sampling(s: Sampling) -> str | None:
    """Why these settings cannot sample (naming the flag and the fix), or None."""
    if s.temperature < 0:
        return f"--temperature {s.temperature}: use 0 (greedy) or more"
    if not 0 < s.top_p <= 1:
        return f"--top-p {s.top_p}: use a value in (0, 1] (1 keeps the whole distribution)"
    return None


def filtered_probs(logits: torch.Tensor, s: Sampling) -> torch.Tensor:
    """Rows of logits [T, V] -> the sampler's probabilities [T, V] in float32: divided by the
    temperature, then top-k, then top-p (the smallest set of most likely tokens whose mass reaches
    top_p; the most likely token always stays), as vLLM's sampler orders them."""
    x = logits.float() / s.temperature
    if s.top_k > 0 and s.top_k < x.shape[-1]:
        kth = x.topk(s.top_k, dim=-1).values[..., -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    if s.top_p < 1.0:
        sorted_x, order = x.sort(dim=-1, descending=True)
        p = sorted_x.softmax(-1)
        drop = p.cumsum(-1) - p >= s.top_p  # mass before this token already reaches top_p
        drop[..., 0] = False
        x = x.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
    return x.softmax(-1)


class Sampler:
    """The sampler of one prompt's decoding: settings plus a generator seeded with `seed`."""

    def __init__(self, settings: Sampling, device: torch.device, seed: int) -> None:
        bad = check_sampling(settings)
        if bad is not None or settings.temperature == 0:
            raise ValueError(bad or "temperature 0 is greedy decoding: use the argmax path, not a Sampler")
        self.settings = settings
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(seed)

    def sample(self, logits: torch.Tensor) -> torch.Tensor:
        """One token per row of logits [T, V] -> ids [T]."""
        probs = filtered_probs(logits, self.settings)
        return torch.multinomial(probs, 1, generator=self.generator).squeeze(-1)

    def verify(self, logits: torch.Tensor, drafts: torch.Tensor,
               draft_probs: torch.Tensor | None = None) -> torch.Tensor:
        """Target logits [k+1, V] over [seq[n], x_1..x_k], drafts [k] (target ids), draft
        probabilities [k, V] (None: one-hot, vLLM's greedy drafts) -> tokens [k+1] whose longest
        prefix equal to `drafts` is the accepted count m; tokens[m] is the residual draw (m < k) or
        the bonus token (m = k). Rows past m are filler. All on the logits' device, no host sync."""
        k = drafts.shape[0]
        p = filtered_probs(logits, self.settings)
        q = (torch.nn.functional.one_hot(drafts, p.shape[-1]).to(p.dtype) if draft_probs is None
             else draft_probs.float())
        col = drafts.view(-1, 1)
        p_x, q_x = p[:k].gather(1, col).squeeze(1), q.gather(1, col).squeeze(1)
        u = torch.rand(k, generator=self.generator, device=p.device, dtype=p.dtype)
        accept = (q_x > 0) & (p_x >= u * q_x)  # u < p/q, as vllm/v1/sample/rejection_sampler.py
        residual = (p[:k] - q).clamp_min(0)
        mass = residual.sum(-1, keepdim=True)
        residual = torch.where(mass > 0, residual / mass.clamp_min(1e-30), p[:k])  # p == q: never rejected
        recovered = torch.multinomial(residual, 1, generator=self.generator).squeeze(-1)
        bonus = torch.multinomial(p[k:], 1, generator=self.generator).view(1)
        m = torch.cumprod(accept.long(), 0).sum()
        drawn = torch.cat([recovered, bonus])
        padded = torch.cat([drafts, bonus])
        return torch.where(torch.arange(k + 1, device=p.device) < m, padded, drawn)
