"""Drafters trained elsewhere: every published EAGLE-3 layout through every eagle command.

The layouts are written by tests/support/_layouts.py from the session's trained toy drafters (no
network). On each: check-checkpoint, evaluate (the same accept_len as the drafter it was written
from: same weights, same answers), import-drafter, vocab --from-draft and one epoch of
train --init-from. Then fine-tuning semantics (float32 masters, the new target's rows, a new draft
vocabulary) and bad input (one error line naming the file and the fix, exit 2, nothing written).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import _layouts as L
import _train_data as td
import helpers as H
import pytest
import torch
from _decode_helpers import speculators_draft_logits
from click.testing import CliRunner
from safetensors.torch import load_file

from eagle.cli import cli
from eagle.drafter import checkpoint

_here = Path(__file__).parent

HELDOUT = _here.parents[2] / "plans" / "data" / "prompts-heldout.jsonl"
EVAL = ["--prompts", str(HELDOUT), "-k", "3", "--limit", "3", "--max-new-tokens", "24", "--no-check", "--json"]
LAYOUT_NAMES = ["ours", *L.LAYOUTS, "speculators_save"]


def eagle(*args: str) -> object:
    res = CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)
    return res


def accept_len(target: Path, draft: Path) -> float:
    res = eagle("evaluate", "--model", target, "--draft", draft, *EVAL)
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)["accept_len"]


@pytest.fixture(scope="module")
def layouts(toy_target: Path, toy_drafter: Path, toy_drafter_normed: Path,
            tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    """layout name -> (its checkpoint, the trained drafter it was written from)."""
    root = tmp_path_factory.mktemp("layouts")
    out = {"ours": (toy_drafter, toy_drafter)}
    for name, build in L.LAYOUTS.items():
        out[name] = (build(toy_drafter, root / name), toy_drafter)
    out["speculators_save"] = (L.speculators_save(toy_drafter_normed, root / "speculators_save", toy_target),
                               toy_drafter_normed)
    return out


@pytest.fixture(scope="module")
def original_accept(toy_target: Path, toy_drafter: Path, toy_drafter_normed: Path) -> dict[Path, float]:
    return {d: accept_len(toy_target, d) for d in (toy_drafter, toy_drafter_normed)}


@pytest.mark.slow
@pytest.mark.parametrize("name", LAYOUT_NAMES)
def test_every_command_reads_the_layout(name: str, layouts, original_accept, toy_target: Path, toy_data: Path,
                                        tmp_path: Path) -> None:
    src, original = layouts[name]
    expected_layout = "eagle" if name.startswith("specforge") else "speculators"

    res = eagle("check-checkpoint", src, "--model", toy_target, "--json")
    report = json.loads(res.stdout)
    assert res.exit_code == 0, report["problems"]
    assert report["layout"] == expected_layout and report["summary"]["layer_ids"] == [2, 4, 5]
    facts = "\n".join(report["facts"])
    assert "vLLM 0.32/0.33 load it as Eagle3LlamaForCausalLM" in facts
    if name in ("null_ids", "no_ids_key"):
        assert "use [2, N//2, N-3] = [2, 4, 5] for this 8-layer target" in facts
    if name == "speculators_save":
        for flag in ("norm_before_fc: true (input_norm.weight [384])", "norm_output: true", "norm_before_residual: true"):
            assert f"{flag}" in facts and "served by vLLM 0.32/0.33" in facts, facts

    # the same weights give the same answers: evaluate reads the layout directly
    assert accept_len(toy_target, src) == original_accept[original]

    res = eagle("import-drafter", src, "--out", tmp_path / "imported", "--model", toy_target, "--json")
    assert res.exit_code == 0, res.output
    imported = checkpoint.read_drafter(tmp_path / "imported")
    assert imported.layout == "speculators" and imported.cfg.layer_ids == [2, 4, 5]
    assert imported.cfg.verifier == str(toy_target.resolve())
    assert imported.cfg.flags() == checkpoint.read_drafter(original).cfg.flags()
    theirs = checkpoint.read_drafter(src, 8).tensors()
    ours = imported.tensors()
    assert set(ours) == set(theirs) and all(torch.equal(ours[k], theirs[k]) for k in ours)  # lossless

    data = shutil.copytree(toy_data, tmp_path / "data")
    res = eagle("vocab", "--data", data, "--from-draft", src)
    assert res.exit_code == 0, res.output
    assert torch.equal(load_file(str(data / "vocab.safetensors"))["d2t"], load_file(str(original / "model.safetensors"))["d2t"])

    res = eagle("train", "--model", toy_target, "--data", data, "--out", tmp_path / "tuned", "--init-from", src,
                "--epochs", "1")
    assert res.exit_code == 0, res.output
    assert f"fine-tuning {src} ({expected_layout} layout); draft vocabulary: the drafter's own" in res.stderr
    tuned = checkpoint.read_drafter(tmp_path / "tuned")
    assert tuned.cfg.flags() == checkpoint.read_drafter(original).cfg.flags()
    assert tuned.cfg.intermediate_size == checkpoint.read_drafter(src, 8).cfg.intermediate_size  # its own shape


@pytest.mark.slow
def test_init_from_bf16_gives_float32_masters_and_the_new_targets_rows(layouts, toy_target: Path,
                                                                        toy_successor: Path) -> None:
    """A bf16 SpecForge drafter for the old target, fine-tuned on the successor with a NEW draft
    vocabulary: float32 trainable weights equal to the stored ones, the embedding and the lm_head
    rows of the new vocabulary from the successor, the forward runs on the CPU."""
    from eagle.drafter import model as drafter

    src, _ = layouts["specforge"]
    ck = checkpoint.read_drafter(src, 8)
    assert set(ck.dtypes[n] for n in ck.shapes if n not in ("d2t", "t2d")) == {"BF16"}
    old_ids = (torch.arange(ck.cfg.draft_vocab_size) + ck.tensors(["d2t"])["d2t"]).tolist()
    new_ids = sorted(set(range(0, 2048, 5)) - set(old_ids))[:256]  # a vocabulary none of whose tokens were drafted
    d2t = torch.tensor(new_ids) - torch.arange(256)
    t2d = torch.zeros(2048, dtype=torch.bool)
    t2d[new_ids] = True
    model = drafter.init_from(ck, toy_successor, layer_ids=[2, 4, 5], d2t=d2t, t2d=t2d, ttt_steps=3)
    trainable = {n: p for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and {p.dtype for p in trainable.values()} == {torch.float32}
    layers = [n for n in trainable if n != "lm_head.weight"]
    stored = ck.tensors(layers)
    assert set(stored) == set(layers)
    assert all(torch.equal(trainable[n].detach(), stored[n].float()) for n in layers)
    succ = load_file(str(toy_successor / "model.safetensors"))
    assert torch.equal(model.embed_tokens.weight, succ["model.embed_tokens.weight"].float())
    # no token of the new vocabulary is in the drafter's: every lm_head row is the successor's, and trains
    assert torch.equal(model.lm_head.weight, succ["lm_head.weight"][t2d].float())
    assert torch.equal(model.d2t, d2t)
    assert model.lm_head.weight.requires_grad and not model.embed_tokens.weight.requires_grad
    batch = {"hidden_states": torch.randn(1, 8, 3 * 128), "input_ids": torch.randint(0, 2048, (1, 8)),
             "document_ids": torch.zeros(1, 8, dtype=torch.long), "position_ids": torch.arange(1, 9)[None],
             "loss_mask": torch.ones(1, 8, dtype=torch.bool), "verifier_last_hidden_states": torch.randn(1, 8, 128)}
    loss, _ = drafter.train_forward(model, batch, 3, drafter.loss_config())
    loss.backward()
    assert torch.isfinite(loss) and trainable["fc.weight"].grad is not None


@pytest.mark.slow
def test_init_from_with_a_changed_vocabulary(layouts, toy_target: Path, toy_data: Path, tmp_path: Path) -> None:
    """`eagle vocab --draft-vocab N` then `train --init-from`: the layers carry over, the log says so."""
    src, _ = layouts["null_ids"]
    data = shutil.copytree(toy_data, tmp_path / "data")
    assert eagle("vocab", "--data", data, "--draft-vocab", "200").exit_code == 0
    res = eagle("train", "--model", toy_target, "--data", data, "--out", tmp_path / "tuned", "--init-from", src,
                "--epochs", "1")
    assert res.exit_code == 0, res.output
    assert "draft vocabulary: changed to the data's (200 tokens" in res.stderr
    tuned = checkpoint.read_drafter(tmp_path / "tuned")
    assert tuned.cfg.draft_vocab_size == 200
    assert torch.equal(tuned.tensors(["d2t"])["d2t"], load_file(str(data / "vocab.safetensors"))["d2t"])


# ---------------------------------------------------------------- bad input: exit 2, one line, nothing written


def run_eagle(*args: object, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """The eagle CLI's `main` in this process (helpers.eagle_inproc), from `cwd` (else here)."""
    return H.eagle_inproc(*map(str, args), cwd=cwd or Path.cwd())


def assert_refused(proc: subprocess.CompletedProcess[str], *named: str) -> str:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, proc.stderr
    for needle in named:
        assert needle in errors[0], errors[0]
    return errors[0]


def snapshot(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


@pytest.mark.slow
def test_truncated_weights_are_refused_everywhere(toy_target: Path, toy_drafter: Path, toy_data: Path,
                                                  tmp_path: Path) -> None:
    broken = shutil.copytree(toy_drafter, tmp_path / "broken", ignore=shutil.ignore_patterns("checkpoints"))
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    data = shutil.copytree(toy_data, tmp_path / "data")
    before = snapshot(data)
    fix = "copy or download the checkpoint again"
    assert_refused(run_eagle("import-drafter", broken, "--out", tmp_path / "out"), str(weights), fix)
    assert_refused(run_eagle("vocab", "--data", data, "--from-draft", broken), str(weights), fix)
    assert_refused(run_eagle("train", "--model", toy_target, "--data", data, "--out", tmp_path / "tuned",
                             "--init-from", broken, "--epochs", "1"), str(weights), fix)
    assert_refused(run_eagle("evaluate", "--model", toy_target, "--draft", broken, *EVAL), str(weights), fix)
    proc = run_eagle("check-checkpoint", broken, "--model", toy_target)
    assert proc.returncode == 2 and str(weights) in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "out").exists() and not (tmp_path / "tuned").exists()
    assert snapshot(data) == before


@pytest.mark.slow
def test_null_layer_ids_with_a_small_target_are_refused(tmp_path: Path) -> None:
    """vLLM's default ids for a 4-layer target repeat a layer: name the file and the fix."""
    from transformers import LlamaConfig, LlamaForCausalLM

    _, draft = td.make_drafter(tmp_path)
    small = tmp_path / "small-target"
    cfg = LlamaConfig(vocab_size=td.VOCAB, hidden_size=td.HIDDEN, intermediate_size=2 * td.HIDDEN, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    LlamaForCausalLM(cfg).save_pretrained(str(small))
    src = L.null_ids(draft, tmp_path / "null-ids")
    error = assert_refused(run_eagle("import-drafter", src, "--out", tmp_path / "out", "--model", small),
                           str(src / "config.json"), "[2, 2, 1]", '"eagle_aux_hidden_state_layer_ids": [a, b, c]')
    assert "4 decoder layers" in error and not (tmp_path / "out").exists()
    proc = run_eagle("check-checkpoint", src, "--model", small)
    assert proc.returncode == 1 and "repeats a layer" in proc.stderr
    # without a target to fill them in, import says what to pass
    assert_refused(run_eagle("import-drafter", src, "--out", tmp_path / "out"), str(src / "config.json"), "--model")
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_a_drafter_for_another_vocabulary_is_refused(toy_target: Path, toy_data: Path, tmp_path: Path) -> None:
    _, draft = td.make_drafter(tmp_path)  # a target vocabulary of 128, the toy target's is 2048
    data = shutil.copytree(toy_data, tmp_path / "data")
    before = snapshot(data)
    fix = "--draft-vocab N"
    assert_refused(run_eagle("vocab", "--data", data, "--from-draft", draft), str(draft / "config.json"), "128", "2048", fix)
    assert_refused(run_eagle("train", "--model", toy_target, "--data", data, "--out", tmp_path / "tuned",
                             "--init-from", draft, "--epochs", "1"), str(draft), "128", "2048", fix)
    assert_refused(run_eagle("import-drafter", draft, "--out", tmp_path / "out", "--model", toy_target),
                   str(draft), "128", "2048")
    assert_refused(run_eagle("evaluate", "--model", toy_target, "--draft", draft, *EVAL), str(draft / "config.json"),
                   "128", "2048")
    assert not (tmp_path / "tuned").exists() and not (tmp_path / "out").exists()
    assert snapshot(data) == before


@pytest.mark.slow
def test_inference_matches_speculators_with_every_norm_flag(toy_target: Path, toy_drafter_normed: Path) -> None:
    """eagle/decode/draft_infer.py (what evaluate / probe / decode run) against speculators' forward on a
    drafter trained with norm_before_fc, norm_output and norm_before_residual: all draft steps."""
    from eagle.decode.draft_infer import load_drafter
    from eagle.drafter import model as edr

    ref = edr.load_drafter(toy_drafter_normed, toy_target).eval()
    assert ref.input_norm is not None and ref.config.norm_output and ref.config.norm_before_residual
    ours = load_drafter(toy_drafter_normed, target_embed=ref.embed_tokens.weight, target_layers=8)
    assert ours.spec.norm_before_fc and ours.spec.norm_output and ours.spec.norm_before_residual
    torch.manual_seed(0)
    t_len = 12
    hs = torch.randn(1, t_len, 3 * 128) * 3
    ids = torch.randint(0, 2048, (1, t_len))
    logits = speculators_draft_logits(ref, hs, ids)
    with torch.inference_mode():
        step0, _ = ours(ours.combine(hs[0]), ids[0], torch.arange(t_len), ours.new_cache(32))
        torch.testing.assert_close(step0, logits[0], rtol=1e-4, atol=1e-4)
        t = 6
        cache = ours.new_cache(32)
        _, feat = ours(ours.combine(hs[0, : t + 1]), ids[0, : t + 1], torch.arange(t + 1), cache)
        feat = feat[-1:]
        for j in (1, 2):  # the drafter's own (post-norm, with norm_output) feature fed back
            out, feat = ours(feat, ids[0, t + j: t + j + 1], torch.tensor([t + j]), cache)
            torch.testing.assert_close(out[0], logits[j][t], rtol=1e-4, atol=1e-4)
    assert logits[0].std() > 0.1
