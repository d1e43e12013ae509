"""Helpers for the decoding tests (test_decode, test_evaluate, test_probe); loaded by path."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny models: threads only add contention on a shared CPU. Use as `_one_thread = helpers.one_thread`."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def write_prompts(path: Path, n: int, salt: int = 7, words: int | None = None) -> Path:
    """`n` prompt-only records in the toy language (OpenAI `messages`); with `words`, each user message cut
    to its first `words` words (a shorter prefill, for tests where every row costs: Triton's interpreter)."""
    from eagle.toy import make_prompts

    records = make_prompts(n, salt=salt)
    if words is not None:
        for record in records:
            for message in record["messages"]:
                message["content"] = " ".join(message["content"].split()[:words])
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def make_random_drafter(target: Path, out: Path, draft_vocab: int = 256, seed: int = 0,
                        scramble: bool = True) -> Path:
    """An untrained speculators drafter for `target`, saved in the servable format via eagle.drafter.model.

    With `scramble`, the trainable weights are redrawn with a larger scale so the drafter's outputs
    depend on every weight (a fresh init is close to an identity map)."""
    from transformers import AutoConfig

    from eagle.drafter import model as edr

    torch.manual_seed(seed)
    cfg = AutoConfig.from_pretrained(target)
    top = torch.sort(torch.randperm(cfg.vocab_size)[:draft_vocab]).values
    d2t = top - torch.arange(draft_vocab)
    t2d = torch.zeros(cfg.vocab_size, dtype=torch.bool)
    t2d[top] = True
    n = cfg.num_hidden_layers
    model = edr.build_drafter(target, layer_ids=[2, n // 2, n - 3], d2t=d2t, t2d=t2d, ttt_steps=3)
    if scramble:
        with torch.no_grad():
            for _, p in model.named_parameters():
                if p.requires_grad:
                    (p.normal_(0, 0.1) if p.dim() > 1 else p.uniform_(0.5, 1.5))
    edr.save(model, out)
    return out


class OracleProposer:
    """Proposes the reference greedy continuation (right by construction), optionally wrong at
    every row whose cache slot is divisible by `wrong_every`: drives the acceptance logic to known
    accept lengths without a trained drafter."""

    hidden_size = 4

    def __init__(self, reference: list[int], vocab: int, wrong_every: int = 0) -> None:
        self.ref = torch.tensor(reference + [0] * 4096, dtype=torch.long)
        self.vocab = vocab
        self.wrong_every = wrong_every

    def new_cache(self, max_len: int, attention: str = "sdpa") -> None:
        return None

    def _at(self, slots: torch.Tensor) -> torch.Tensor:
        ids = self.ref[slots + 2]
        if self.wrong_every:
            ids = torch.where(slots % self.wrong_every == 0, (ids + 1) % self.vocab, ids)
        return ids

    def propose_rows(self, aux, tokens, slots, cache):
        return self._at(slots), torch.zeros(len(slots), self.hidden_size, dtype=aux.dtype)

    def propose_step(self, token, feat, slot, cache, out=None):
        ids = self._at(slot)
        return (ids if out is None else out.copy_(ids)), feat


def speculators_draft_logits(ref_model, hs: torch.Tensor, ids: torch.Tensor, ttt_steps: int = 3) -> list[torch.Tensor]:
    """The logits of each draft step of speculators' own forward (`eagle.drafter.model.draft_tokens`) on
    one row of hidden states `hs` [1, T, 3H] and tokens `ids` [1, T]: what our drafter must match."""
    from eagle.drafter import model as edr

    t_len = ids.shape[1]
    batch = {"hidden_states": hs, "input_ids": ids, "document_ids": torch.zeros(1, t_len, dtype=torch.long),
             "position_ids": torch.arange(1, t_len + 1)[None]}
    logits: list[torch.Tensor] = []
    hook = ref_model.lm_head.register_forward_hook(lambda m, a, o: logits.append(o[0].detach()))
    edr.draft_tokens(ref_model, batch, ttt_steps=ttt_steps)
    hook.remove()
    return logits
