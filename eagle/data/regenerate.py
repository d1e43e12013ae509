"""`eagle prepare --regenerate`: the target answers every user turn; its answers stay token ids.

Backends, one contract (`Answerer`: prompt token ids in, the target's output token ids and why it
stopped out):
- `vllm` (production): vLLM's server (eagle/serving/server.py) with the requests of a round in flight
  together (`--vllm-concurrency`), every engine flag passable (`--vllm-arg`); a GPU host gets
  CUDA graphs. Sampling is per request and seeded, so a run is reproducible whatever the batching.
- `hf` (small targets, tests): transformers `generate`, batched and left-padded by length.

Round r answers the r-th user turn of every conversation that has one, with the earlier answers
in its context (eagle/data/turns.py builds the samples and their contexts). A context that has reached
the length limit (--max-len, or the server's max_model_len) gets no more turns.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from eagle.common import EagleError, progress
from eagle.data.turns import Answer, Sample, TurnError
from eagle.serving.client import Generation, GenerationRequest, Sampling, request_seed
from eagle.serving.flags import VllmFlags

Answerer = Callable[[list[GenerationRequest], str], list[Generation]]


class RegenSettings(BaseModel):
    backend: str = "hf"  # "hf" | "vllm"
    max_new_tokens: int = 256
    sampling: Sampling = Sampling()
    n: int = 1  # samples per conversation (sampling only)
    max_len: int = 2048  # contexts never grow past this: the sample is cut there anyway
    batch_size: int = 16  # hf: prompts per generate call
    concurrency: int = 64  # vllm: requests in flight
    device: str = "auto"  # hf
    dtype: str = "auto"
    startup_timeout: float = 600.0
    vllm_url: str | None = None  # vllm: use this running server (serving the same target) instead of starting one


def check_settings(s: RegenSettings) -> None:
    if s.backend not in ("hf", "vllm"):
        raise EagleError(f"unknown --backend {s.backend!r}; use hf or vllm")
    if s.n < 1:
        raise EagleError("--n must be at least 1")
    if s.n > 1 and s.sampling.temperature == 0:
        raise EagleError(f"--n {s.n} with greedy decoding (--temperature 0) gives {s.n} identical copies; "
                         "set --temperature (e.g. 0.7) or use --n 1")
    if s.sampling.temperature < 0 or not 0 < s.sampling.top_p <= 1:
        raise EagleError("--temperature must be >= 0 and --top-p in (0, 1]")
    if s.backend == "vllm" and s.sampling.temperature > 2:
        raise EagleError(f"--temperature {s.sampling.temperature}: vLLM accepts 0 to 2")


def answer_rounds(samples: list[Sample], answer: Answerer, settings: RegenSettings,
                  limit: int) -> dict[int, tuple[str, str]]:
    """Fill every sample's answers, round by round; returns {sample index: (reason, why it failed)}."""
    failed: dict[int, tuple[str, str]] = {}
    rnd = 0
    while True:
        active: list[int] = []
        requests: list[GenerationRequest] = []
        for i, s in enumerate(samples):
            if s.done or i in failed:
                continue
            room = min(limit, settings.max_len) - len(s.ids)
            if room <= 0:
                s.stop()
                continue
            active.append(i)
            requests.append(GenerationRequest(prompt_ids=s.context(), max_tokens=min(settings.max_new_tokens, room),
                                              seed=request_seed(settings.sampling.seed, i, rnd)))
        if not active:
            return failed
        for i, req, gen in zip(active, requests, answer(requests, f"generate (turn {rnd + 1})"), strict=True):
            stopped = gen.finish_reason == "stop"
            room_cut = not stopped and req.max_tokens < settings.max_new_tokens  # the length limit, not max tokens
            try:
                samples[i].add(Answer(token_ids=gen.token_ids, stopped=stopped, room_cut=room_cut))
            except TurnError as exc:
                failed[i] = (exc.reason, str(exc))
            except Exception as exc:  # noqa: BLE001 - the template itself raised (raise_exception on a role)
                failed[i] = ("chat template failed", f"chat template failed: {exc}")
        rnd += 1


# ---------------------------------------------------------------- backends


def stop_ids(model_dir: Path, tokenizer: Any, trust_remote_code: bool = False) -> set[int]:
    """The ids that end generation: the target's eos ids (eagle/target.py, as generate uses them) and
    the tokenizer's (vLLM stops at both)."""
    from eagle.target import open_target

    ids = set(open_target(model_dir, trust_remote_code).eos_ids())
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    return ids


def hf_answerer(model_dir: Path, tokenizer: Any, settings: RegenSettings, trust_remote_code: bool) -> Answerer:
    """transformers `generate`: batches of --batch-size prompts sorted by length, left-padded."""
    import torch

    from eagle.target import input_device, load_model

    model = load_model(model_dir, settings.device, settings.dtype, trust_remote_code=trust_remote_code)
    eos = stop_ids(model_dir, tokenizer, trust_remote_code)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(eos, default=0)
    dev = input_device(model)  # the embedding's device (a big model may be spread over GPUs)
    s = settings.sampling
    calls = [0]

    def answer(requests: list[GenerationRequest], desc: str) -> list[Generation]:
        order = sorted(range(len(requests)), key=lambda i: len(requests[i].prompt_ids))
        out: list[Generation | None] = [None] * len(requests)
        bar = progress(total=len(requests), desc=desc, unit="prompt")
        sample_kw: dict[str, Any] = {"do_sample": False}
        if s.temperature > 0:
            sample_kw = {"do_sample": True, "temperature": s.temperature, "top_p": s.top_p,
                         "top_k": s.top_k if s.top_k > 0 else None}
        for b in range(0, len(order), settings.batch_size):
            idx = order[b: b + settings.batch_size]
            torch.manual_seed(request_seed(s.seed, calls[0], b))
            width = max(len(requests[i].prompt_ids) for i in idx)
            x = torch.full((len(idx), width), pad, dtype=torch.long)
            att = torch.zeros_like(x)
            for r, i in enumerate(idx):
                ids = requests[i].prompt_ids
                x[r, width - len(ids):] = torch.tensor(ids)
                att[r, width - len(ids):] = 1
            with torch.inference_mode():
                gen = model.generate(input_ids=x.to(dev), attention_mask=att.to(dev), pad_token_id=pad,
                                     max_new_tokens=max(requests[i].max_tokens for i in idx),
                                     eos_token_id=sorted(eos) or None, **sample_kw)
            for r, i in enumerate(idx):
                new = gen[r, width:].tolist()
                end = next((j for j, t in enumerate(new) if t in eos), None)
                limit = requests[i].max_tokens
                if end is not None and end < limit:
                    out[i] = Generation(token_ids=new[: end + 1], finish_reason="stop")
                else:
                    out[i] = Generation(token_ids=new[:limit], finish_reason="length")
            bar.update(len(idx))
        bar.close()
        calls[0] += 1
        return [g for g in out if g is not None]

    return answer


@contextlib.contextmanager
def vllm_answerer(model_dir: Path, settings: RegenSettings, flags: VllmFlags,
                  echo: bool = True) -> Iterator[tuple[Answerer, int]]:
    """vLLM for the target (a server it starts and stops, or --vllm-url's); yields (answerer, max_model_len)."""
    from eagle.serving.client import generate_many, served_model
    from eagle.serving.flags import SERVED_NAME, host_has_cuda, max_positions, server_spec
    from eagle.serving.server import running_server

    def answerer(url: str, name: str, on_error: Callable[[BaseException], Exception]) -> Answerer:
        def answer(requests: list[GenerationRequest], desc: str) -> list[Generation]:
            bar = progress(total=len(requests), desc=desc, unit="prompt")
            try:
                return generate_many(url, requests, settings.sampling, settings.concurrency,
                                           on_done=lambda _: bar.update(1), model_name=name)
            except Exception as exc:  # noqa: BLE001 - show vLLM's side too
                raise on_error(exc) from None
            finally:
                bar.close()

        return answer

    if settings.vllm_url:
        name, limit = served_model(settings.vllm_url)
        yield answerer(settings.vllm_url, name, lambda e: EagleError(f"vLLM at {settings.vllm_url}: {e}")), limit
        return
    positions = max_positions(model_dir)
    spec = server_spec(model_dir, flags, host_has_cuda(),
                             dtype=None if settings.dtype == "auto" else settings.dtype,
                             max_model_len=min(settings.max_len, positions or settings.max_len),
                             max_num_seqs=settings.concurrency)
    with running_server(spec, settings.startup_timeout, echo, prefix="eagle-vllm-regen-") as server:
        yield answerer(server.url, SERVED_NAME, server.failed), server.max_model_len()


def regenerate(model_dir: Path, tokenizer: Any, samples: list[Sample], settings: RegenSettings,
               flags: VllmFlags | None = None, echo: bool = True) -> dict[int, tuple[str, str]]:
    """Answer every sample's turns with the target; returns {sample index: (reason, why it failed)}."""
    check_settings(settings)
    flags = flags or VllmFlags()
    if not samples:
        return {}
    if settings.backend == "vllm":
        with vllm_answerer(model_dir, settings, flags, echo) as (answer, limit):
            return answer_rounds(samples, answer, settings, limit)
    from eagle.serving.flags import max_positions

    answer = hf_answerer(model_dir, tokenizer, settings, flags.trusts_remote_code)
    return answer_rounds(samples, answer, settings, max_positions(model_dir) or settings.max_len)
