"""Hidden states fetched from a running vLLM: the data source behind `eagle train --hidden-states vllm`.

Neither the target nor hidden-state files sit beside the drafter: a vLLM server started with the
extract_hidden_states method (eagle/serving/extraction.py, the engine of `eagle extract --backend
vllm`) prefills each sample when a batch is made, its kv connector writes the sample's states to
a file in the server's storage folder, and this source reads the file and deletes it at once. That
is the protocol of speculators' online training (hs_connectors' FileBackend: a completion request,
`kv_transfer_params.hidden_states_path` in the answer, the file read under its `.lock` and then
deleted), with eagle's extraction request and reader (extraction.extract_one).

Bounds: at most `in_flight` requests are outstanding at any moment (one semaphore across the
batch-building threads), so the storage folder never holds more than `in_flight` sample files,
each at most (batch_tokens + 1) x (aux layers + 1) x hidden x the served dtype's bytes; the
trainer builds the next batch on a side thread while the step runs (dataset.prefetched).

Sameness with the offline path: the states are rounded to bfloat16, as `eagle extract` stores
them, then shifted and packed by dataset.shift_sample / dataset.collate; the data position of a
resumed run is its pack order (pure in the seed and epoch), so the states are fetched again.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from eagle.common import EagleError
from eagle.train.dataset import DataSource

if TYPE_CHECKING:
    from eagle.target import Target
    from eagle.train.config import TrainConfig


def check_server(url: str) -> None:
    """Refuse a --server URL where nothing answers, naming it (one line)."""
    import httpx

    try:
        httpx.get(url.rstrip("/") + "/health", timeout=10.0)
    except httpx.HTTPError as exc:
        raise EagleError(f"--server {url}: nothing answers there ({type(exc).__name__}); start an extraction "
                         "server (docs/eagle.md, Training, --hidden-states vllm) or leave --server out and eagle "
                         "starts its own") from None


class ServerStates(DataSource):
    """Every row of a prepared dataset, its hidden states fetched from the extraction server at `url`."""

    prefetch = True  # batches are built ahead on a side thread: the server prefills while the step runs
    runs_target = False

    def __init__(self, data_dir: str | os.PathLike[str], url: str, num_aux: int, hidden_size: int, budget: int,
                 in_flight: int = 8, closing: contextlib.ExitStack | None = None) -> None:
        from eagle.data import hidden_io

        self.data_dir, self.url = Path(data_dir), url.rstrip("/")
        self.input_ids, self.loss_mask = hidden_io.prepared_rows(self.data_dir)
        self.lengths = [len(r) for r in self.input_ids]
        self.rows = list(range(len(self.input_ids)))
        self.num_aux, self.hidden_size, self.budget = num_aux, hidden_size, budget
        self.in_flight = max(1, in_flight)
        self._slots = threading.BoundedSemaphore(self.in_flight)
        self._closing = closing or contextlib.ExitStack()

    def __len__(self) -> int:
        return len(self.lengths)

    def probe(self) -> None:
        """One request (the shortest sample): a server that is no extraction server, or extracts other
        layers, is refused here, naming the URL, before anything trains."""
        short = min(range(len(self)), key=self.lengths.__getitem__)
        try:
            self.raw(short)
        except EagleError as exc:
            first = str(exc).splitlines()[0]
            raise EagleError(f"--server {self.url} did not give hidden states ({first}); it must be vLLM started "
                             "with the extract_hidden_states method and a hidden-states kv connector, serving the "
                             "target as 'eagle-target' (docs/eagle.md, Training, --hidden-states vllm)") from None

    def raw(self, i: int) -> dict[str, torch.Tensor]:
        """Sample i's {hidden_states [T', L+1, H] bf16, input_ids, loss_mask} for its first
        T' = min(T, budget + 1) tokens: what dataset.load_raw gives the offline path."""
        from eagle.serving.extraction import extract_one

        n = min(self.lengths[i], self.budget + 1)
        ids = self.input_ids[i][:n]
        with self._slots:  # the file exists from the request until extract_one has read and deleted it
            hs = extract_one(self.url, ids, timeout=600.0)["hidden_states"]
        if hs.dim() != 3 or tuple(hs.shape) != (n, self.num_aux + 1, self.hidden_size):
            raise EagleError(f"vLLM hidden states have shape {list(hs.shape)}, expected [{n}, {self.num_aux + 1}, "
                             f"{self.hidden_size}]: was the server started with other --layer-ids or another target?")
        from eagle.data.hidden_io import all_finite

        hs = hs.to(torch.bfloat16)
        if not all_finite(hs):  # as the offline reader checks each file
            raise EagleError(f"vLLM at {self.url} gave NaN/Inf hidden states for row {i} of {self.data_dir}")
        return {"hidden_states": hs, "input_ids": torch.as_tensor(ids, dtype=torch.long),
                "loss_mask": torch.as_tensor(self.loss_mask[i][:n], dtype=torch.long)}

    def batch(self, indices: list[int], device: torch.device, dtype: torch.dtype = torch.float32,
              layout: bool = False, layout_multiple: int = 1, pad_to: int | None = None) -> dict[str, torch.Tensor]:
        from eagle.serving.client import in_flight
        from eagle.train import dataset

        got = dict(in_flight(self.raw, indices, self.in_flight))
        samples = [dataset.shift_sample(got[k], self.budget) for k in range(len(indices))]
        pin = torch.device(device).type == "cuda"
        b = dataset.collate(samples, dtype=dtype, layout=layout, pin=pin, layout_multiple=layout_multiple,
                            pad_to=pad_to)
        return dataset.to_device(b, device)

    def tokens(self, indices: list[int]) -> int:
        return sum(min(max(self.lengths[i] - 1, 0), self.budget) for i in indices)

    def take_target_seconds(self) -> float:
        return 0.0

    def close(self) -> None:
        self._closing.close()  # eagle's own server stops here, its storage goes


def disk_bound_bytes(in_flight: int, budget: int, num_aux: int, hidden_size: int, dtype_bytes: int) -> int:
    """The most the storage folder holds: `in_flight` samples of at most budget + 1 tokens (pure)."""
    return in_flight * (budget + 1) * (num_aux + 1) * hidden_size * dtype_bytes


def open_server_states(config: TrainConfig, target: Target, layer_ids: list[int],
                       say: Callable[[str], None]) -> ServerStates:
    """The source for `config` (hidden_states == 'vllm'): the server at --server,
    checked, or eagle's own extraction server, started now and stopped when the source closes."""
    from eagle.data.hidden_io import open_prepared
    from eagle.serving.extraction import extraction_spec
    from eagle.serving.flags import host_has_cuda, vllm_flags
    from eagle.serving.server import running_server

    stack = contextlib.ExitStack()
    try:
        cuda = host_has_cuda()
        if not config.server and config.world_size > 1:
            raise EagleError(f"--hidden-states vllm with {config.world_size} processes: each would start its own "
                             "server; start one extraction server and pass its URL as --server")
        if config.server:
            check_server(config.server)
            url, where = config.server, "the server's own storage folder"
        else:
            if config.server_storage:
                storage = Path(config.server_storage)
                storage.mkdir(parents=True, exist_ok=True)
            else:
                storage = Path(tempfile.mkdtemp(prefix="eagle-train-states-"))
                stack.callback(shutil.rmtree, storage, True)
            rows = list(open_prepared(Path(config.data)).with_format(None)["input_ids"])
            cut = [r[: config.batch_tokens + 1] for r in rows]
            spec = extraction_spec(target.dir, cut, layer_ids, storage,
                                   vllm_flags(config.vllm_args, config.trust_remote_code), cuda, config.in_flight)
            server = stack.enter_context(running_server(spec, echo=True, prefix="eagle-train-vllm-"))
            url, where = server.url, str(storage)
        data = ServerStates(config.data, url, len(layer_ids), target.hidden_size, config.batch_tokens,
                            config.in_flight, stack)
        data.probe()
        bound = disk_bound_bytes(data.in_flight, config.batch_tokens, len(layer_ids), target.hidden_size,
                                 2 if cuda else 4)
        say(f"hidden states from vLLM at {url}: at most {data.in_flight} samples in flight, so at most "
            f"{bound / 2**20:,.1f} MiB in {where} (each file deleted once read)")
        return data
    except BaseException:
        stack.close()
        raise
