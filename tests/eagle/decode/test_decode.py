"""The fast decoder (eagle/decode/fast.py) and the pure-torch drafter (eagle/decode/draft_infer.py).

Reference implementations: transformers (target forward and `generate(do_sample=False)`) and
speculators' Eagle3DraftModel through eagle.drafter.model.
"""

from __future__ import annotations

import json
from pathlib import Path

import _decode_helpers as helpers
import pytest
import torch

K = 3
MAX_NEW = 40


_one_thread = helpers.one_thread  # autouse, module scope: one torch thread for these tiny models


@pytest.fixture(scope="module")
def prompts(toy_target: Path, tmp_path_factory: pytest.TempPathFactory) -> list[list[int]]:
    from eagle.prompts import load_prompt_token_ids

    path = helpers.write_prompts(tmp_path_factory.mktemp("prompts") / "p.jsonl", 4)
    return load_prompt_token_ids(toy_target, path)


@pytest.fixture(scope="module")
def references(toy_target: Path, prompts: list[list[int]]) -> list[list[int]]:
    from eagle.decode.evaluate import reference_greedy

    return reference_greedy(toy_target, prompts, MAX_NEW, "cpu", torch.float32)


@pytest.fixture(scope="module")
def random_draft(toy_target: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return helpers.make_random_drafter(toy_target, tmp_path_factory.mktemp("draft") / "random")


def _decoder(target: Path, draft: Path | None, proposer=None, max_len: int = 256):
    from eagle.decode.factory import eos_ids_of, load_decoder
    from eagle.decode.fast import Decoder, TargetModel
    from eagle.target import default_layer_ids

    if proposer is None:
        return load_decoder(target, draft, max_len=max_len)
    model = TargetModel.from_pretrained(target)
    return Decoder(model, proposer, max_len=max_len, layer_ids=default_layer_ids(model.num_layers),
                   eos_ids=eos_ids_of(target))


@pytest.mark.slow  # toy_target: trained once per machine (minutes on a cold one)
def test_target_forward_matches_transformers(toy_target: Path, prompts: list[list[int]]) -> None:
    from transformers import AutoModelForCausalLM

    from eagle.decode.fast import TargetModel

    hf = AutoModelForCausalLM.from_pretrained(toy_target).eval()
    ours = TargetModel.from_pretrained(toy_target)
    ids = torch.tensor(prompts[0])
    with torch.inference_mode():
        ref = hf(ids[None], output_hidden_states=True)
        logits, aux, _ = ours(ids, torch.arange(len(ids)), ours.new_cache(64), [2, 4, 5])
    assert (logits - ref.logits[0]).abs().max() < 1e-4
    expected_aux = torch.cat([ref.hidden_states[i][0] for i in (2, 4, 5)], dim=-1)
    assert (aux - expected_aux).abs().max() < 1e-4


@pytest.mark.slow  # toy_target: trained once per machine (minutes on a cold one)
def test_greedy_equals_transformers_generate(toy_target: Path, prompts, references) -> None:
    dec = _decoder(toy_target, None)
    outs = [dec.generate_greedy(p, MAX_NEW) for p in prompts]
    assert outs == references
    # the toy target is trained: its continuations are not a repeated token
    assert all(len(set(r)) > 5 for r in references)


@pytest.mark.slow  # toy_target: trained once per machine (minutes on a cold one)
def test_speculative_random_drafter_is_exact_and_accepts_nothing(toy_target, random_draft, prompts,
                                                                 references) -> None:
    dec = _decoder(toy_target, random_draft)
    results = [dec.generate_speculative(p, MAX_NEW, K) for p in prompts]
    assert [r.tokens for r in results] == references
    accepted = [m for r in results for m in r.accepted]
    assert len(accepted) >= sum(len(r) - 1 for r in references) * 0.9  # ~one verify step per token
    assert 1.0 <= 1 + sum(accepted) / len(accepted) < 1.15


@pytest.mark.slow  # toy_target: trained once per machine (minutes on a cold one)
def test_speculative_with_always_right_drafts(toy_target, prompts, references) -> None:
    from transformers import AutoConfig

    vocab = AutoConfig.from_pretrained(toy_target).vocab_size
    for p, ref in zip(prompts[:2], references[:2], strict=True):
        dec = _decoder(toy_target, None, helpers.OracleProposer(p + ref, vocab))
        res = dec.generate_speculative(p, MAX_NEW, K)
        assert res.tokens == ref
        assert res.accepted[:-1] == [K] * (len(res.accepted) - 1)
        assert len(res.accepted) == -(-(len(ref) - 1) // (K + 1))  # ceil: k+1 tokens per verify


@pytest.mark.slow  # toy_target: trained once per machine (minutes on a cold one)
def test_a_longer_chain_than_the_cycle_buffers_hold(toy_target, prompts, references) -> None:
    """k = 10 needs 11 rows in the cycle's token and position buffers (made for 9): they grow, the
    graphs over the smaller ones are dropped, and k = 3 on the same decoder still decodes right."""
    from transformers import AutoConfig

    from eagle.decode.fast import SPEC_ROWS

    vocab = AutoConfig.from_pretrained(toy_target).vocab_size
    p, ref = prompts[0], references[0]
    dec = _decoder(toy_target, None, helpers.OracleProposer(p + ref, vocab))
    assert dec.generate_speculative(p, MAX_NEW, K).tokens == ref
    k = SPEC_ROWS + 1
    res = dec.generate_speculative(p, MAX_NEW, k)
    assert dec.tokens.shape[0] == k + 1 and res.tokens == ref
    assert res.accepted[:-1] == [k] * (len(res.accepted) - 1)
    assert dec.generate_speculative(p, MAX_NEW, K).tokens == ref


@pytest.mark.slow  # toy_target: trained once per machine (minutes on a cold one)
def test_time_stages_with_and_without_a_drafter(toy_target: Path, random_draft: Path, prompts) -> None:
    """The bench's stage timings: a target alone times its step and its (k+1)-token verify (no aux
    states to take); with a drafter, its step and catch-up too; the decoder still decodes after."""
    from eagle.decode.factory import load_decoder

    plain = load_decoder(toy_target, None, max_len=128)
    assert set(plain.time_stages(K, prompts[0], iters=2)) == {"target_step", "verify"}
    dec = load_decoder(toy_target, random_draft, max_len=128)
    times = dec.time_stages(K, prompts[0], iters=2)
    assert set(times) == {"target_step", "verify", "draft_step", "catchup"} and min(times.values()) > 0
    assert dec.generate_speculative(prompts[0], 8, K).tokens == plain.generate_greedy(prompts[0], 8)


@pytest.mark.slow  # toy_target: trained once per machine (minutes on a cold one)
@pytest.mark.parametrize("wrong_every", [2, 3, 5])
def test_acceptance_follows_the_first_wrong_draft(toy_target, prompts, references, wrong_every) -> None:
    from transformers import AutoConfig

    vocab = AutoConfig.from_pretrained(toy_target).vocab_size
    p, ref = prompts[1], references[1]
    dec = _decoder(toy_target, None, helpers.OracleProposer(p + ref, vocab, wrong_every))
    res = dec.generate_speculative(p, MAX_NEW, K)
    assert res.tokens == ref
    # simulate: d_j is proposed by the drafter row in cache slot n+j-2 (d_1 by the catch-up row
    # n-1); the oracle is wrong when that slot is divisible by wrong_every
    n, expected = len(p), []
    while n < len(p) + len(ref) - 1:
        m = 0
        while m < K and (n + m - 1) % wrong_every != 0:
            m += 1
        expected.append(m)
        n += m + 1
    assert res.accepted[:-1] == expected[:-1]
    assert len(res.accepted) == len(expected)


@pytest.mark.slow  # toy_target: trained once per machine (minutes on a cold one)
def test_drafter_matches_speculators_forward(toy_target: Path, random_draft: Path) -> None:
    from eagle.decode.draft_infer import load_drafter
    from eagle.drafter import model as edr

    ref_model = edr.load_drafter(random_draft, toy_target).eval()
    ours = load_drafter(random_draft, target_vocab_size=ref_model.config.transformer_layer_config.vocab_size,
                        target_embed=ref_model.embed_tokens.weight)  # the checkpoint has none (as published)
    torch.manual_seed(1)
    t_len, h = 12, ours.spec.target_hidden_size
    hs = torch.randn(1, t_len, 3 * h)
    ids = torch.randint(0, ours.spec.vocab_size, (1, t_len))
    logits = helpers.speculators_draft_logits(ref_model, hs, ids)
    with torch.inference_mode():
        step0, _ = ours(ours.combine(hs[0]), ids[0], torch.arange(t_len), ours.new_cache(32))
        assert (step0 - logits[0]).abs().max() < 1e-4
        # steps 2 and 3 at row t: the drafter's own feature fed back, tokens teacher-forced
        t = 6
        cache = ours.new_cache(32)
        _, feat = ours(ours.combine(hs[0, : t + 1]), ids[0, : t + 1], torch.arange(t + 1), cache)
        feat = feat[-1:]
        for j in (1, 2):
            out, feat = ours(feat, ids[0, t + j: t + j + 1], torch.tensor([t + j]), cache)
            assert (out[0] - logits[j][t]).abs().max() < 1e-4
    assert logits[0].std() > 0.1  # a drafter whose outputs depend on its weights


@pytest.mark.slow  # toy_target: trained once per machine (minutes on a cold one)
def test_bad_drafter_checkpoints_are_named(tmp_path: Path, random_draft: Path) -> None:
    import shutil

    from safetensors.torch import load_file, save_file

    from eagle.decode.draft_infer import DraftCheckpointError, load_drafter

    with pytest.raises(DraftCheckpointError, match="vocabulary"):
        load_drafter(random_draft, target_vocab_size=99)
    broken = tmp_path / "no-d2t"
    shutil.copytree(random_draft, broken)
    tensors = load_file(str(broken / "model.safetensors"))
    del tensors["d2t"]
    save_file(tensors, str(broken / "model.safetensors"))
    with pytest.raises(DraftCheckpointError, match="no d2t"):
        load_drafter(broken)
    tensors["d2t"] = torch.zeros(256, dtype=torch.long)
    tensors["fc.weight"] = tensors["fc.weight"][:, :-1].contiguous()
    save_file(tensors, str(broken / "model.safetensors"))
    with pytest.raises(DraftCheckpointError, match=r"fc.weight has shape"):
        load_drafter(broken)
    cfg = json.loads((broken / "config.json").read_text())
    cfg["speculators_model_type"] = "eagle"
    (broken / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(DraftCheckpointError, match="expected 'eagle3'"):
        load_drafter(broken)


def test_layer_ids_are_checked() -> None:
    from eagle.common import EagleError
    from eagle.target import check_layer_ids

    assert check_layer_ids([2, 4, 5], 8, "x") == [2, 4, 5]
    with pytest.raises(EagleError, match="out of range"):
        check_layer_ids([2, 4, 8], 8, "x")
    with pytest.raises(EagleError, match="collide"):
        check_layer_ids([2, 2, 1], 4, "x")


@pytest.mark.slow  # toy_target: trained once per machine (minutes on a cold one)
def test_rope_and_fused_projections_match_the_reference(toy_target: Path) -> None:
    from transformers import AutoConfig
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    from eagle.decode.fast import TargetModel
    from eagle.decode.llama_ops import Rope, apply_rope, fuse_projections, rope_inv_freq

    # rope with the sign folded into the sin table == transformers' rotate_half form
    cfg = AutoConfig.from_pretrained(toy_target)
    inv_freq, scaling = rope_inv_freq(cfg)
    rope = Rope(inv_freq, scaling)
    torch.manual_seed(3)
    pos = torch.tensor([0, 5, 17, 40])
    q, k = torch.randn(1, 4, 4, 32), torch.randn(1, 2, 4, 32)  # [batch, heads, T, head_dim]
    emb = torch.cat([pos[:, None].float() * inv_freq[None]] * 2, dim=-1)
    q_ref, k_ref = apply_rotary_pos_emb(q, k, (emb.cos() * scaling)[None], (emb.sin() * scaling)[None])
    cos, sin_signed = rope(pos, torch.float32)
    # the tables a triton cache holds: row s is the rope of position s + offset, bit for bit
    for dtype in (torch.float32, torch.bfloat16):
        for offset in (0, 1):
            cos_t, sin_t = rope.table(64, dtype, offset)
            rows = pos[pos >= offset]
            want_cos, want_sin = rope(rows, dtype)
            assert torch.equal(cos_t[rows - offset], want_cos) and torch.equal(sin_t[rows - offset], want_sin)
    assert torch.allclose(apply_rope(q[0].transpose(0, 1), cos, sin_signed), q_ref[0].transpose(0, 1), atol=1e-6)
    assert torch.allclose(apply_rope(k[0].transpose(0, 1), cos, sin_signed), k_ref[0].transpose(0, 1), atol=1e-6)
    # one [q; k; v] and one [gate; up] matrix give the same logits as the separate projections
    model = TargetModel.from_pretrained(toy_target)
    ids = torch.arange(3, 20)
    with torch.inference_mode():
        before, _, _ = model(ids, torch.arange(len(ids)), model.new_cache(32))
        fuse_projections(model)
        after, _, _ = model(ids, torch.arange(len(ids)), model.new_cache(32))
    assert model.layers[0].self_attn.qkv_weight is not None and not hasattr(model.layers[0].mlp, "gate_proj")
    assert (before - after).abs().max() < 1e-5


@pytest.mark.slow  # toy_target: trained once per machine (minutes on a cold one)
@pytest.mark.parametrize("in_flight", [1, 3])
def test_launches_in_flight_do_not_change_the_output(toy_target, random_draft, prompts, references,
                                                      in_flight) -> None:
    from eagle.decode.draft_infer import load_drafter
    from eagle.decode.factory import eos_ids_of
    from eagle.decode.fast import Decoder, TargetModel
    from eagle.target import default_layer_ids

    target = TargetModel.from_pretrained(toy_target)
    drafter = load_drafter(random_draft, target_embed=target.embed_tokens.weight,
                           target_vocab_size=target.config.vocab_size)
    dec = Decoder(target, drafter, max_len=256, layer_ids=default_layer_ids(target.num_layers),
                  eos_ids=eos_ids_of(toy_target), sync_every=in_flight)
    for p, ref in zip(prompts[:2], references[:2], strict=True):
        assert dec.generate_greedy(p, MAX_NEW) == ref
        assert set(dec.last_timing) == {"prefill_s", "decode_s"}
        res = dec.generate_speculative(p, MAX_NEW, K)
        assert res.tokens == ref
        # every committed token came from a counted verify step; overshoot stays within in_flight
        assert len(res.accepted) <= dec.last_timing["cycles"] <= len(res.accepted) + in_flight
