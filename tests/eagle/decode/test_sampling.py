"""eagle/decode/sampling.py: the production sampler's filters and the rejection-sampling verify step
(pure, tiny tensors); `eagle evaluate --temperature` end to end is in test_evaluate.py."""

from __future__ import annotations

import pytest
import torch

from eagle.decode.sampling import Sampler, check_sampling, filtered_probs
from eagle.serving.client import Sampling

CPU = torch.device("cpu")


def test_top_p_keeps_the_smallest_head_reaching_the_mass_and_temperature_sharpens() -> None:
    logits = torch.tensor([[0.5, 0.2, 0.2, 0.1]]).log()
    assert filtered_probs(logits, Sampling(temperature=1.0)).tolist()[0] == pytest.approx([0.5, 0.2, 0.2, 0.1])
    head = filtered_probs(logits, Sampling(temperature=1.0, top_p=0.6))[0]
    assert head.tolist() == pytest.approx([0.5 / 0.7, 0.2 / 0.7, 0.0, 0.0]) or \
        head.tolist() == pytest.approx([0.5 / 0.7, 0.0, 0.2 / 0.7, 0.0])  # a tie at 0.2: either one
    assert filtered_probs(logits, Sampling(temperature=1.0, top_p=0.1))[0].tolist() == [1.0, 0.0, 0.0, 0.0]
    cold = filtered_probs(logits, Sampling(temperature=0.5))[0]
    assert cold[0] > 0.5 and cold.sum().item() == pytest.approx(1.0)
    assert filtered_probs(logits, Sampling(temperature=1.0, top_k=1))[0].tolist() == [1.0, 0.0, 0.0, 0.0]


def test_bad_settings_are_named() -> None:
    assert "--top-p 0" in str(check_sampling(Sampling(temperature=1.0, top_p=0.0)))
    assert "--temperature -1" in str(check_sampling(Sampling(temperature=-1.0)))
    with pytest.raises(ValueError, match="greedy"):
        Sampler(Sampling(temperature=0.0), CPU, 0)


@pytest.mark.parametrize("one_hot", [True, False])
def test_verify_samples_the_target_distribution(one_hot: bool) -> None:
    """The first output token of a verify step is distributed as the target's p0, whatever the drafts:
    greedy drafts (q one-hot, vLLM's EAGLE-3 default) or drafts sampled from a q of their own."""
    p0 = torch.tensor([0.1, 0.6, 0.25, 0.05])
    q = torch.tensor([0.5, 0.1, 0.2, 0.2])
    logits = torch.stack([p0.log(), p0.log()])  # [k+1 = 2, V]
    sampler = Sampler(Sampling(temperature=1.0), CPU, seed=1)
    n = 6000
    counts = torch.zeros(4)
    accepted = 0
    for _ in range(n):
        if one_hot:
            draft = torch.tensor([2])  # the drafter's argmax
            out = sampler.verify(logits, draft)
        else:
            draft = torch.multinomial(q, 1, generator=sampler.generator)
            out = sampler.verify(logits, draft, q.view(1, -1))
        counts[out[0]] += 1
        accepted += int(out[0] == draft[0])
    freq = counts / n
    assert torch.allclose(freq, p0, atol=0.02), freq
    expected = float(p0[2]) if one_hot else float(torch.minimum(p0, q).sum())  # P(accept) = sum min(p, q)
    assert accepted / n == pytest.approx(expected, abs=0.02)


def test_verify_marks_the_accepted_prefix_and_is_reproducible() -> None:
    """Drafts the target is sure of are all kept and the bonus follows; a draft it never picks is
    rejected and replaced by another token; the same seed draws the same tokens."""
    sure = torch.full((4, 5), -30.0)
    sure[0, 1] = sure[1, 2] = sure[2, 3] = sure[3, 4] = 0.0  # the target always says 1, 2, 3, then 4
    out = Sampler(Sampling(temperature=1.0), CPU, seed=0).verify(sure, torch.tensor([1, 2, 3]))
    assert out.tolist() == [1, 2, 3, 4]
    out = Sampler(Sampling(temperature=1.0), CPU, seed=0).verify(sure, torch.tensor([1, 0, 3]))
    assert out[:2].tolist() == [1, 2]  # the second draft rejected: the residual's token instead
    flat = torch.zeros(4, 50)
    drafts = torch.tensor([7, 8, 9])
    a = [Sampler(Sampling(temperature=1.0, top_p=0.9), CPU, seed=5).verify(flat, drafts).tolist() for _ in range(2)]
    b = Sampler(Sampling(temperature=1.0, top_p=0.9), CPU, seed=6).verify(flat, drafts).tolist()
    assert a[0] == a[1] and a[0] != b  # 45 tokens in the nucleus: equal by chance ~1e-5
