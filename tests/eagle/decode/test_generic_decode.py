"""Decoding every architecture: the generic path (eagle/decode/generic.py, the target's own
transformers forward with a KV cache) and the fast path's Qwen3 support (eagle/decode/fast.py).

Untrained tiny targets of each architecture (tests/support/_arch_helpers.py), float32 on the CPU. What must
hold whatever the weights:
- greedy decoding equals transformers' `generate(do_sample=False)` token for token;
- speculative decoding with any drafter equals plain greedy decoding (the algorithm is exact), and a
  drafter proposing the right tokens is accepted (accept_len near k + 1) while a wrong one is not;
- `load_decoder` picks the fast path for Llama and Qwen3 and the generic one for the others, and
  says which ran; `--decoder fast` on an architecture it lacks is refused with exit 2.
"""

from __future__ import annotations

from pathlib import Path

import _arch_helpers as arch_helpers
import _decode_helpers as helpers
import pytest
import torch

_one_thread = helpers.one_thread

ARCHS = arch_helpers.ARCHS
K, MAX_NEW = 3, 20


@pytest.fixture(scope="module")
def targets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return arch_helpers.random_targets(tmp_path_factory.mktemp("arch-targets"))


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(3)
    return [torch.randint(6, 2000, (n,), generator=g).tolist() for n in (5, 11)]


def random_drafter(target: Path, out: Path) -> Path:
    """An untrained speculators drafter for `target` (its weights scrambled so every one matters)."""
    from eagle.drafter import model as drafter
    from eagle.target import open_target

    t = open_target(target, trust_remote_code=True)
    torch.manual_seed(0)
    top = torch.sort(torch.randperm(t.vocab_size)[:256]).values
    t2d = torch.zeros(t.vocab_size, dtype=torch.bool)
    t2d[top] = True
    model = drafter.build_drafter(target, layer_ids=t.default_layer_ids(), d2t=top - torch.arange(256), t2d=t2d,
                                  ttt_steps=3)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                (p.normal_(0, 0.1) if p.dim() > 1 else p.uniform_(0.5, 1.5))
    drafter.save(model, out)
    return out


def hf_greedy(target: Path, prompt: list[int], max_new: int) -> list[int]:
    from eagle.target import open_target

    t = open_target(target, trust_remote_code=True)
    model = t.load_model("cpu", torch.float32)
    eos = t.eos_ids()
    with torch.inference_mode():
        y = model.generate(torch.tensor([prompt]), max_new_tokens=max_new, do_sample=False, eos_token_id=eos,
                           pad_token_id=eos[0])
    return y[0, len(prompt):].tolist()


@pytest.mark.parametrize("arch", ARCHS + ["remote"])
def test_every_architecture_decodes_exactly(arch: str, targets: dict[str, Path], prompts: list[list[int]],
                                            tmp_path: Path) -> None:
    from eagle.decode.factory import load_decoder
    from eagle.decode.interface import required_len

    target = targets[arch]
    draft = random_drafter(target, tmp_path / "draft")
    dec = load_decoder(target, draft, max_len=required_len(16, MAX_NEW, K), trust_remote_code=True)
    assert dec.path == ("fast" if arch in ("llama", "qwen3") else "generic")
    for ids in prompts:
        plain = dec.generate_greedy(ids, MAX_NEW)
        assert plain == hf_greedy(target, ids, MAX_NEW)
        res = dec.generate_speculative(ids, MAX_NEW, K)
        assert res.tokens == plain
        assert all(0 <= m <= K for m in res.accepted) and res.accepted


@pytest.mark.parametrize("arch", ["deepseek_v3", "kimi_k25", "qwen3"])
def test_generic_path_accepts_right_drafts_and_rejects_wrong_ones(arch: str, targets: dict[str, Path],
                                                                   prompts: list[list[int]]) -> None:
    """An oracle drafter (the reference continuation) is accepted whole; one wrong at every 4th
    slot is cut there: the verify step and the cache crop of the generic path are right."""
    from eagle.decode.generic import GenericDecoder
    from eagle.decode.interface import required_len
    from eagle.target import open_target

    t = open_target(targets[arch])
    model = t.load_model("cpu", torch.float32)
    ids = prompts[1]
    dec = GenericDecoder(model, None, max_len=required_len(16, MAX_NEW, K), eos_ids=[])
    ref = ids + dec.generate_greedy(ids, MAX_NEW)
    right = GenericDecoder(model, helpers.OracleProposer(ref, t.vocab_size), max_len=dec.max_len,
                           layer_ids=t.default_layer_ids(), eos_ids=[])
    res = right.generate_speculative(ids, MAX_NEW, K)
    assert res.tokens == ref[len(ids):]
    assert res.accept_len == pytest.approx(K + 1, abs=0.6)  # only the last cycle may be cut short
    wrong = GenericDecoder(model, helpers.OracleProposer(ref, t.vocab_size, wrong_every=4), max_len=dec.max_len,
                           layer_ids=t.default_layer_ids(), eos_ids=[])
    res_wrong = wrong.generate_speculative(ids, MAX_NEW, K)
    assert res_wrong.tokens == ref[len(ids):]
    assert res_wrong.accept_len < res.accept_len


def test_fast_decoder_refuses_what_it_lacks(targets: dict[str, Path]) -> None:
    from eagle.common import EagleError
    from eagle.decode.factory import load_decoder

    with pytest.raises(EagleError, match="--decoder generic") as err:
        load_decoder(targets["deepseek_v3"], None, max_len=64, path="fast")
    assert err.value.code == 2
    generic = load_decoder(targets["qwen3"], None, max_len=64, path="generic")
    assert generic.path == "generic"  # forced: any architecture runs there


def test_fast_and_generic_paths_agree_on_qwen3(targets: dict[str, Path], prompts: list[list[int]]) -> None:
    """Same target, two implementations, float32: same tokens, aux states equal to rounding."""
    from eagle.decode.factory import load_decoder

    fast = load_decoder(targets["qwen3"], None, max_len=64, path="fast")
    generic = load_decoder(targets["qwen3"], None, max_len=64, path="generic")
    for ids in prompts:
        assert fast.generate_greedy(ids, MAX_NEW) == generic.generate_greedy(ids, MAX_NEW)
        a, b = fast.aux_states(ids, [2, 4, 5]), generic.aux_states(ids, [2, 4, 5])
        assert a.shape == b.shape == (len(ids), 3 * 128)
        assert float((a - b).abs().max()) < 1e-4
