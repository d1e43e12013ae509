"""`eagle evaluate` and `eagle bench` through the CLI, and the Leviathan-bound math."""

from __future__ import annotations

import json
from pathlib import Path

import _decode_helpers as helpers
import pytest
from click.testing import CliRunner

from eagle.cli import cli
from eagle.decode.evaluate import acceptance_stats, first_mismatch
from eagle.decode.leviathan import (
    K_MAX,
    acceptance_from_accept_len,
    best_k,
    expected_tokens,
    leviathan_speedup,
)

_one_thread = helpers.one_thread  # autouse, module scope: one torch thread for these tiny models


@pytest.fixture(scope="module")
def random_draft(toy_target: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return helpers.make_random_drafter(toy_target, tmp_path_factory.mktemp("draft") / "random")


@pytest.fixture(scope="module")
def prompts_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return helpers.write_prompts(tmp_path_factory.mktemp("prompts") / "p.jsonl", 3, salt=11)


def _run(args: list[str], metrics: Path | None = None):
    env = {"RUNBOOK_METRICS": str(metrics)} if metrics else {}
    return CliRunner().invoke(cli, args, env=env, catch_exceptions=False)


# -- pure math --------------------------------------------------------------------------------
def test_expected_tokens_and_leviathan_bound() -> None:
    assert expected_tokens(0.0, 3) == 1.0
    assert expected_tokens(1.0, 3) == 4.0
    assert expected_tokens(0.5, 3) == pytest.approx(1 + 0.5 + 0.25 + 0.125)
    assert leviathan_speedup(0.8, 3, 0.1) == pytest.approx((1 - 0.8**4) / 0.2 / 1.3)
    assert leviathan_speedup(0.0, 5, 0.2) == pytest.approx(0.5)  # useless drafts only cost
    with pytest.raises(ValueError):
        expected_tokens(1.5, 3)


def test_best_k_maximises_the_bound_at_cheap_drafts() -> None:
    """a=0.8, c=0.05: bound(k) = (1 - 0.8^(k+1)) / 0.2 / (1 + 0.05k) rises all the way to K_MAX:
    k=1 1.714, 2 2.218, 3 2.567, 4 2.801, 5 2.951, 6 3.040, 7 3.082, 8 3.092 (and k=9 3.078 falls)."""
    assert K_MAX == 8
    k, bound = best_k(0.8, 0.05)
    assert k == 8
    assert bound == pytest.approx((1 - 0.8**9) / 0.2 / 1.4) == pytest.approx(3.0921, abs=1e-4)
    assert best_k(0.8, 0.05, k_max=20)[0] == 8  # the true optimum, not the cap


def test_best_k_is_one_when_drafting_costs_more_than_it_yields() -> None:
    """a=0.3, c=0.5: k=1 (1 + 0.3) / 1.5 = 0.867, k=2 (1 + 0.3 + 0.09) / 2 = 0.695: shorter is better,
    and a bound below 1 says no k pays for its drafting."""
    k, bound = best_k(0.3, 0.5)
    assert (k, bound) == (1, pytest.approx(1.3 / 1.5))
    assert bound < 1.0


def test_best_k_edge_cases() -> None:
    assert best_k(0.0, 0.2) == (1, pytest.approx(1 / 1.2))  # nothing accepted: the shortest costs least
    assert best_k(0.0, 0.0) == (1, 1.0)  # all k tie at 1.0: the tie goes to the shorter draft
    assert best_k(0.99, 0.0) == (K_MAX, pytest.approx(expected_tokens(0.99, K_MAX)))  # free drafts: longest
    assert best_k(1.0, 0.0) == (K_MAX, float(K_MAX + 1))
    assert best_k(0.999, 0.1)[0] == K_MAX  # near-certain acceptance outruns a 10% drafting cost
    with pytest.raises(ValueError):
        best_k(0.5, 0.1, k_max=0)
    with pytest.raises(ValueError):
        best_k(0.5, -0.1)


@pytest.mark.parametrize("a", [0.0, 0.3, 0.62, 0.9, 0.999])
@pytest.mark.parametrize("k", [1, 3, 7])
def test_acceptance_inverts_expected_tokens(a: float, k: int) -> None:
    assert acceptance_from_accept_len(expected_tokens(a, k), k) == pytest.approx(a, abs=1e-6)


def test_acceptance_stats_count_like_vllm() -> None:
    accept_len, rates = acceptance_stats([3, 0, 1, 3], 3)
    assert accept_len == pytest.approx(1 + 7 / 4)
    assert rates == [0.75, 0.5, 0.5]
    assert first_mismatch([1, 2, 3], [1, 2, 3]) is None
    assert first_mismatch([1, 2, 3], [1, 5, 3]) == 1
    assert first_mismatch([1, 2], [1, 2, 3]) == 2


# -- the commands -----------------------------------------------------------------------------
@pytest.mark.slow  # toy_target: trained once per machine (minutes on a cold one)
def test_evaluate_random_drafter(toy_target: Path, random_draft: Path, prompts_file: Path, tmp_path: Path) -> None:
    metrics = tmp_path / "m.json"
    res = _run(["evaluate", "--model", str(toy_target), "--draft", str(random_draft), "--prompts",
                str(prompts_file), "-k", "3", "--max-new-tokens", "24"], metrics)
    assert res.exit_code == 0, res.output
    m = json.loads(metrics.read_text())
    assert m["greedy_match"] == 1 and m["generate_match"] == 1  # float32: transformers' generate agrees too
    assert m["fast_decoder"] == 1  # a Llama target takes the fast path
    assert 1.0 <= m["accept_len"] < 1.15
    assert set(m) == {"accept_len", "accept_rate_0", "accept_rate_1", "accept_rate_2", "greedy_match",
                      "generate_match", "fast_decoder", "accept_len_min", "accept_len_max", "accept_len_ci_lo",
                      "accept_len_ci_hi"}
    assert m["accept_rate_0"] >= m["accept_rate_1"] >= m["accept_rate_2"]
    assert m["accept_len_min"] <= m["accept_len_ci_lo"] <= m["accept_len"] <= m["accept_len_ci_hi"] <= m["accept_len_max"]
    assert "accept_len" in res.output


@pytest.mark.slow  # toy_drafter: trained once per session (seconds once toy_data is there)
def test_sampled_acceptance_is_reproducible_and_greedy_unchanged(toy_target: Path, toy_drafter: Path,
                                                                 prompts_file: Path, tmp_path: Path) -> None:
    """At temperature 0 the flags change no byte of the metrics or the report; at temperature 1.0
    the sampled figures come beside the greedy ones, equal for one seed (and for both decoders:
    one sampling home), different for another seed."""
    base = ["evaluate", "--model", str(toy_target), "--draft", str(toy_drafter), "--prompts", str(prompts_file),
            "-k", "3", "--max-new-tokens", "24", "--no-check", "--json"]

    def run(name: str, *extra: str) -> tuple[bytes, dict]:
        res = _run([*base, *extra], tmp_path / f"{name}.json")
        assert res.exit_code == 0, res.output
        return (tmp_path / f"{name}.json").read_bytes(), json.loads(res.output)

    greedy_bytes, greedy = run("greedy")
    zero_bytes, zero = run("zero", "--temperature", "0", "--top-p", "0.5", "--seed", "9")
    assert zero_bytes == greedy_bytes and zero == greedy and greedy["sampling"] is None
    one_bytes, one = run("one", "--temperature", "1.0", "--top-p", "0.95", "--seed", "3")
    two_bytes, two = run("two", "--temperature", "1.0", "--top-p", "0.95", "--seed", "3")
    assert one_bytes == two_bytes and one == two
    m, g = json.loads(one_bytes), json.loads(greedy_bytes)
    assert {k: m[k] for k in g} == g  # the greedy figures are untouched
    assert set(m) - set(g) == {"sampled_accept_len", "sampled_accept_rate_0", "sampled_accept_rate_1",
                               "sampled_accept_rate_2", "sample_temperature", "sample_top_p"}
    assert 1.0 < m["sampled_accept_len"] <= 4.0 and m["sample_temperature"] == 1.0 and m["sample_top_p"] == 0.95
    samples = [r["sampled_tokens"] for r in one["per_prompt"]]
    assert samples != [r["sampled_tokens"] for r in run("other", *SAMPLED[:4], "--seed", "4")[1]["per_prompt"]]
    generic = run("generic", *SAMPLED, "--decoder", "generic")[1]
    assert [r["sampled_tokens"] for r in generic["per_prompt"]] == samples
    print(f"\n[evaluate] trained toy drafter, 3 prompts x 24 tokens, k 3: greedy accept_len {g['accept_len']:.3f}, "
          f"sampled (t 1.0, top-p 0.95) {m['sampled_accept_len']:.3f}")


SAMPLED = ["--temperature", "1.0", "--top-p", "0.95", "--seed", "3"]


@pytest.mark.slow  # toy_drafter: trained once per session
def test_acceptance_per_suite_and_category(toy_target: Path, toy_drafter: Path, prompts_file: Path,
                                           tmp_path: Path) -> None:
    """The toy prompts as an MT-Bench question.jsonl of two categories: the same token ids, so the
    same overall acceptance as the chat file, split by category (each category's verify steps
    add up to the whole), as a suite metric and one metric per category."""
    firsts = [json.loads(line)["messages"][0]["content"] for line in prompts_file.read_text().splitlines()]
    suite, chat_file = tmp_path / "question.jsonl", tmp_path / "chat.jsonl"
    suite.write_text("".join(json.dumps({"question_id": 81 + i, "category": ("coding", "Math Reasoning")[i % 2],
                                         "turns": [text, "more?"]}) + "\n" for i, text in enumerate(firsts)))
    chat_file.write_text("".join(json.dumps({"messages": [{"role": "user", "content": text}]}) + "\n"
                                 for text in firsts))
    base = ["--model", str(toy_target), "--draft", str(toy_drafter), "-k", "3", "--max-new-tokens", "16",
            "--no-check", "--json"]
    chat = _run(["evaluate", *base, "--prompts", str(chat_file)], tmp_path / "chat.json")
    res = _run(["evaluate", *base, "--prompts", str(suite), *SAMPLED], tmp_path / "suite.json")
    assert chat.exit_code == 0 and res.exit_code == 0, res.output
    report, m = json.loads(res.output), json.loads((tmp_path / "suite.json").read_text())
    assert report["suite"] == "mt-bench" and json.loads(chat.output)["suite"] == "chat"
    assert m["accept_len"] == json.loads((tmp_path / "chat.json").read_text())["accept_len"]
    cats = report["by_category"]
    assert list(cats) == ["coding", "Math Reasoning"] and [c["prompts"] for c in cats.values()] == [2, 1]
    assert sum(c["verify_steps"] for c in cats.values()) == sum(r["verify_steps"] for r in report["per_prompt"])
    assert m["accept_len_suite_mt_bench"] == m["accept_len"]
    assert m["accept_len_cat_coding"] == cats["coding"]["accept_len"]
    assert m["accept_len_cat_math_reasoning"] == cats["Math Reasoning"]["accept_len"]
    assert m["sampled_accept_len_cat_coding"] == cats["coding"]["sampled_accept_len"]
    assert m["sampled_accept_len_suite_mt_bench"] == m["sampled_accept_len"]


def test_sampling_flags_refuse_bad_values(tmp_path: Path) -> None:
    for flag, value in (("--top-p", "0"), ("--top-p", "1.5"), ("--temperature", "-1")):
        res = CliRunner().invoke(cli, ["evaluate", "--model", str(tmp_path), "--draft", str(tmp_path), "--prompts",
                                       str(tmp_path / "p.jsonl"), flag, value])
        assert res.exit_code == 2 and flag in res.output and "Traceback" not in res.output


@pytest.mark.slow  # toy_target: trained once per machine (minutes on a cold one)
def test_bench_random_drafter(toy_target: Path, random_draft: Path, prompts_file: Path, tmp_path: Path) -> None:
    metrics = tmp_path / "m.json"
    res = _run(["bench", "--model", str(toy_target), "--draft", str(random_draft), "--prompts",
                str(prompts_file), "-k", "2", "--max-new-tokens", "16", "--limit", "2", "--json"], metrics)
    assert res.exit_code == 0, res.output
    report = json.loads(res.output)
    m = json.loads(metrics.read_text())
    for name in ("plain_tok_s", "spec_tok_s", "speedup", "accept_len", "cost_ratio", "leviathan_bound",
                 "bound_fraction"):
        assert m[name] > 0, name
    assert report["spec_matches_plain"] is True
    assert m["speedup"] == pytest.approx(m["spec_tok_s"] / m["plain_tok_s"])
    assert m["bound_fraction"] == pytest.approx(m["speedup"] / m["leviathan_bound"])
    assert m["accept_len_min"] <= m["accept_len_ci_lo"] <= m["accept_len"] <= m["accept_len_ci_hi"] <= m["accept_len_max"]
    # a random drafter accepts ~nothing, so the bound is about 1 / (k*c + 1) < 1
    assert m["leviathan_bound"] < 1.0
    # best_k: the bound's own maximum over 1..K_MAX, so never below the bound at the run's k
    assert m["best_k"] in range(1, K_MAX + 1) and report["best_k"] == m["best_k"]
    assert m["best_k_bound"] >= m["leviathan_bound"]
    assert m["best_k_bound"] == pytest.approx(leviathan_speedup(report["per_token_accept"], m["best_k"], m["cost_ratio"]))


@pytest.mark.slow  # toy_target: trained once per machine (minutes on a cold one)
def test_evaluate_refuses_bad_input_clearly(toy_target: Path, random_draft: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"messages": [{"role": "user", "content": "bako"}]}\n{"messages": 3}\n')
    metrics = tmp_path / "m.json"
    res = _run(["evaluate", "--model", str(toy_target), "--draft", str(random_draft), "--prompts", str(bad)], metrics)
    assert res.exit_code == 1
    assert f"{bad}:2:" in res.output and "messages" in res.output
    assert "Traceback" not in res.output and not metrics.exists()
    res = _run(["evaluate", "--model", str(toy_target), "--draft", str(tmp_path / "nope"), "--prompts", str(bad)])
    assert res.exit_code == 1 and "not a drafter checkpoint" in res.output


def test_prompt_spread_brackets_the_runs_accept_len_and_names_the_worst_prompt() -> None:
    """accept_len's spread over the prompts: min / max are the prompts' own figures, the 95% interval
    (prompts resampled, seeded) holds the pooled figure and narrows with more prompts alike."""
    from eagle.decode.evaluate import PromptResult, prompt_spread

    def row(accepted: int, steps: int) -> PromptResult:
        return PromptResult(prompt_tokens=5, new_tokens=accepted + steps, verify_steps=steps, accepted=accepted,
                            matches_greedy=True, first_greedy_mismatch=None)

    rows = [row(20, 10), row(5, 10), row(30, 10), row(12, 10)]  # accept_len 3.0, 1.5, 4.0, 2.2
    s = prompt_spread(rows)
    pooled = 1 + 67 / 40
    assert (s["accept_len_min"], s["accept_len_max"]) == (1.5, 4.0)
    assert 1.5 <= s["accept_len_ci_lo"] < pooled < s["accept_len_ci_hi"] <= 4.0
    assert prompt_spread(rows) == s  # seeded: the same prompts, the same interval
    wide = s["accept_len_ci_hi"] - s["accept_len_ci_lo"]
    many = prompt_spread(rows * 6)
    assert many["accept_len_ci_hi"] - many["accept_len_ci_lo"] < wide
    assert prompt_spread([row(20, 10)]) == {} and prompt_spread([row(0, 0), row(3, 2)]) == {}
