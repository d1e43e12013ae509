"""The requests eagle sends a running vLLM server over HTTP: streamed greedy completions with
timings (serve-bench), sampled generations as token ids (prepare --regenerate), the served model's
card, /metrics' spec-decode counters, and `in_flight` (many requests at once, vLLM batches them).
Nothing here imports vllm.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any

from pydantic import BaseModel

from eagle.common import EagleError
from eagle.serving.flags import SERVED_NAME

SPEC_PREFIX = "vllm:spec_decode_"

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")

_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def parse_prometheus(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Prometheus text exposition -> [(name, labels, value)] (comments skipped)."""
    out = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if m:
            labels = dict(_LABEL.findall(m.group(2) or ""))
            out.append((m.group(1), labels, float(m.group(3))))
    return out


class SpecCounters(BaseModel):
    """vLLM's cumulative spec-decode counters (summed over engines)."""

    drafts: float = 0.0
    draft_tokens: float = 0.0
    accepted: float = 0.0
    accepted_per_pos: list[float] = []

    def minus(self, other: SpecCounters) -> SpecCounters:
        n = max(len(self.accepted_per_pos), len(other.accepted_per_pos))
        mine = self.accepted_per_pos + [0.0] * (n - len(self.accepted_per_pos))
        theirs = other.accepted_per_pos + [0.0] * (n - len(other.accepted_per_pos))
        return SpecCounters(drafts=self.drafts - other.drafts, draft_tokens=self.draft_tokens - other.draft_tokens,
                            accepted=self.accepted - other.accepted,
                            accepted_per_pos=[a - b for a, b in zip(mine, theirs, strict=True)])


def spec_counters(metrics_text: str) -> SpecCounters:
    """Read the `vllm:spec_decode_*_total` counters out of a /metrics page."""
    c = SpecCounters()
    per_pos: dict[int, float] = {}
    for name, labels, value in parse_prometheus(metrics_text):
        if name == SPEC_PREFIX + "num_drafts_total":
            c.drafts += value
        elif name == SPEC_PREFIX + "num_draft_tokens_total":
            c.draft_tokens += value
        elif name == SPEC_PREFIX + "num_accepted_tokens_total":
            c.accepted += value
        elif name == SPEC_PREFIX + "num_accepted_tokens_per_pos_total" and "position" in labels:
            pos = int(labels["position"])
            per_pos[pos] = per_pos.get(pos, 0.0) + value
    c.accepted_per_pos = [per_pos.get(i, 0.0) for i in range(max(per_pos) + 1)] if per_pos else []
    return c


def acceptance_metrics(delta: SpecCounters) -> dict[str, float]:
    """accept_len = 1 + accepted/drafts (the bonus token counted, as vLLM does); per-position rates."""
    if delta.drafts <= 0:
        raise EagleError("vLLM counted no spec-decode drafts during the run; is the drafter loaded? "
                         "(look for 'speculative' in the server log)")
    out = {"vllm_accept_len": 1.0 + delta.accepted / delta.drafts,
           "vllm_draft_accept_rate": delta.accepted / delta.draft_tokens if delta.draft_tokens else 0.0}
    for i, acc in enumerate(delta.accepted_per_pos):
        out[f"vllm_accept_rate_{i}"] = acc / delta.drafts
    return out


def in_flight(work: Callable[[Any], Any], items: Sequence[Any], concurrency: int) -> Iterator[tuple[int, Any]]:
    """Run `work(item)` with at most `concurrency` calls in flight; yield (position, result) as each
    finishes. The first failure is raised (the calls still in flight are waited for, none started)."""
    with ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
        pending: dict[Future[Any], int] = {}
        nxt = 0
        while pending or nxt < len(items):
            while nxt < len(items) and len(pending) < max(1, concurrency):
                pending[pool.submit(work, items[nxt])] = nxt
                nxt += 1
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for fut in sorted(done, key=pending.__getitem__):
                pos = pending.pop(fut)
                try:
                    result = fut.result()
                except BaseException:
                    nxt = len(items)
                    for other in pending:
                        other.cancel()
                    raise
                yield pos, result


class Sampling(BaseModel):
    """Sampling settings for regeneration; temperature 0 is greedy."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = -1
    seed: int = 0


def request_seed(base: int, sample: int, rnd: int = 0) -> int:
    """A distinct, reproducible seed per (sample, round) from a base --seed: vLLM's per-request
    `seed` (prepare --regenerate, serve-bench) and eagle evaluate's per-prompt generator."""
    return (base * 1_000_003 + sample * 1009 + rnd) % (2**63 - 1)


class RequestResult(BaseModel):
    prompt_tokens: int
    output_token_ids: list[int]
    ttft_s: float
    latency_s: float
    finish_reason: str | None = None


def complete(url: str, prompt_ids: list[int], max_tokens: int, ignore_eos: bool = False,
             timeout: float = 600.0, sampling: Sampling | None = None, seed: int | None = None) -> RequestResult:
    """One streamed completion with a token-id prompt, greedy or with `sampling` (vLLM's per-request
    `seed`: `seed`, else sampling.seed); returns the output ids and timings."""
    import httpx

    body: dict[str, Any] = {"model": SERVED_NAME, "prompt": prompt_ids, "max_tokens": max_tokens, "temperature": 0.0,
                            "stream": True, "ignore_eos": ignore_eos, "return_token_ids": True,
                            "skip_special_tokens": False}
    if sampling is not None and sampling.temperature > 0:
        body |= {"temperature": sampling.temperature, "top_p": sampling.top_p, "top_k": sampling.top_k,
                 "seed": sampling.seed if seed is None else seed}
    start = time.perf_counter()
    ttft = None
    ids: list[int] = []
    finish = None
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=timeout) as r:
        if r.status_code != 200:
            r.read()
            raise EagleError(f"vLLM refused a completion ({r.status_code}): {r.text[:500]}")
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            for choice in chunk.get("choices", []):
                new = choice.get("token_ids") or []
                if new and ttft is None:
                    ttft = time.perf_counter() - start
                ids.extend(new)
                finish = choice.get("finish_reason") or finish
    latency = time.perf_counter() - start
    return RequestResult(prompt_tokens=len(prompt_ids), output_token_ids=ids, ttft_s=ttft or latency,
                         latency_s=latency, finish_reason=finish)


def run_prompts(url: str, prompts: Sequence[list[int]], max_tokens: int, concurrency: int = 1,
                ignore_eos: bool = False, sampling: Sampling | None = None,
                positions: Sequence[int] | None = None) -> tuple[list[RequestResult], float]:
    """Send all prompts (`concurrency` in flight), greedy or with `sampling` (prompt i, at `positions[i]`
    in its suite, with the seed request_seed(sampling.seed, position): the same whatever the batching
    or grouping); return results in prompt order and the wall time."""
    start = time.perf_counter()
    results: list[RequestResult | None] = [None] * len(prompts)
    where = list(positions) if positions is not None else list(range(len(prompts)))
    seeds = [request_seed(sampling.seed, where[i]) if sampling is not None else None for i in range(len(prompts))]

    def send(i: int) -> RequestResult:
        return complete(url, prompts[i], max_tokens, ignore_eos, sampling=sampling, seed=seeds[i])

    for pos, res in in_flight(send, list(range(len(prompts))), concurrency):
        results[pos] = res
    return [r for r in results if r is not None], time.perf_counter() - start


class Generation(BaseModel):
    """What the target produced for one prompt: its token ids exactly (a stop token it emitted
    included) and why it stopped (`stop`: a stop token; `length`: max tokens reached)."""

    token_ids: list[int]
    finish_reason: str | None = None


class GenerationRequest(BaseModel):
    prompt_ids: list[int]
    max_tokens: int
    seed: int = 0


def generate(url: str, req: GenerationRequest, sampling: Sampling, timeout: float = 3600.0,
             model_name: str = SERVED_NAME) -> Generation:
    """One non-streamed completion; the answer as token ids (no text round trip)."""
    import httpx

    body = {"model": model_name, "prompt": req.prompt_ids, "max_tokens": req.max_tokens,
            "temperature": sampling.temperature, "top_p": sampling.top_p, "top_k": sampling.top_k,
            "seed": req.seed, "n": 1, "return_token_ids": True, "skip_special_tokens": False}
    r = httpx.post(url + "/v1/completions", json=body, timeout=timeout)
    if r.status_code != 200:
        raise EagleError(f"vLLM refused a completion ({r.status_code}): {r.text[:500]}")
    choice = r.json()["choices"][0]
    ids = choice.get("token_ids")
    if ids is None:
        raise EagleError("vLLM's answer carries no token_ids (return_token_ids needs vLLM >= 0.10)")
    return Generation(token_ids=[int(t) for t in ids], finish_reason=choice.get("finish_reason"))


def generate_many(url: str, requests: Sequence[GenerationRequest], sampling: Sampling, concurrency: int,
                  on_done: Callable[[int], None] | None = None, model_name: str = SERVED_NAME) -> list[Generation]:
    """All requests with `concurrency` in flight (vLLM batches them); results in request order."""
    out: list[Generation | None] = [None] * len(requests)
    for pos, gen in in_flight(lambda r: generate(url, r, sampling, model_name=model_name), list(requests),
                              concurrency):
        out[pos] = gen
        if on_done:
            on_done(pos)
    return [g for g in out if g is not None]


def served_model(url: str) -> tuple[str, int]:
    """(model name, max_model_len) of a running OpenAI-compatible vLLM server at `url`."""
    import httpx

    try:
        r = httpx.get(url.rstrip("/") + "/v1/models", timeout=30.0)
        r.raise_for_status()
        card = r.json()["data"][0]
        return str(card["id"]), int(card.get("max_model_len") or 0)
    except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as exc:
        raise EagleError(f"no vLLM server answers at {url} ({exc}); start one or leave out --vllm-url") from None
