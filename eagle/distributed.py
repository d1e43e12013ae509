"""The single source of truth for the process topology under torchrun: rank, world size, local rank,
the device a rank uses, and the few collectives eagle needs. Every other module asks here; nothing
else reads RANK / WORLD_SIZE / LOCAL_RANK / LOCAL_WORLD_SIZE / MASTER_ADDR.

Not under torchrun (no such variables) every process is rank 0 of a world of 1 and the
collectives return their input: one code path for one process and for many.

- `topology(env)`: what torchrun set (pure: give `env` to test it).
- `rank_device(device, topo, cuda)`: `auto`/`cuda` means `cuda:LOCAL_RANK` under torchrun.
- `init(device_name)`: join the process group (nccl on GPUs, gloo on CPU or when ranks share GPUs)
  and pick this rank's device; `eagle train` calls it once.
- `all_sum`, `barrier`, `gather_objects`: the collectives, no-ops for a world of 1.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from eagle.common import pick_device, warn

if TYPE_CHECKING:
    import torch


class Topology(BaseModel):
    """This process's place among torchrun's processes (rank 0 of 1 when not under torchrun)."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0
    local_world: int = 1
    rendezvous: bool = False  # MASTER_ADDR set: a process group can form

    @property
    def main(self) -> bool:
        """The rank that writes files, metrics and the summary."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world > 1


_joined = False  # True while the process group `init` made is alive (`leave` destroys it)


def topology(env: Mapping[str, str] | None = None) -> Topology:
    """The topology torchrun describes in `env` (os.environ by default)."""
    env = os.environ if env is None else env
    world = int(env.get("WORLD_SIZE", "1"))
    return Topology(rank=int(env.get("RANK", "0")), world=world, local_rank=int(env.get("LOCAL_RANK", "0")),
                    local_world=int(env.get("LOCAL_WORLD_SIZE", str(world))), rendezvous="MASTER_ADDR" in env)


def is_main() -> bool:
    """False on every torchrun rank but 0: those leave reporting to rank 0."""
    return topology().main


def rank_device(device: str, topo: Topology, cuda: bool) -> str:
    """Under torchrun with GPUs, --device auto/cuda means cuda:LOCAL_RANK; anything else is kept."""
    if cuda and topo.distributed and device in ("auto", "cuda"):
        return f"cuda:{topo.local_rank}"
    return device


def init(device_name: str) -> tuple[Topology, torch.device]:
    """This process's topology and device, the process group joined. Under torchrun, rank R trains on
    cuda:R over NCCL; when there are more processes than GPUs they share them (cuda:R mod count) over
    gloo, which NCCL refuses (one rank per GPU) but which runs DDP correctly, if slowly (a test of DDP
    on one GPU). CPU ranks use gloo and split the cores between them."""
    import torch
    import torch.distributed as td

    topo = topology()
    device = pick_device(device_name)
    backend = "gloo"
    if device.type == "cuda":
        count = torch.cuda.device_count()
        device = torch.device("cuda", topo.local_rank % count if topo.distributed else (device.index or 0))
        torch.cuda.set_device(device)
        backend = "nccl" if topo.local_world <= count else "gloo"
        if topo.local_world > count and topo.main:
            warn(f"{topo.local_world} processes on {count} GPU(s): they share GPUs over gloo (slow; NCCL needs "
                 "one GPU each)")
    if topo.distributed and not td.is_initialized():
        td.init_process_group(backend=backend)
        global _joined
        _joined = True
    if device.type == "cpu" and topo.distributed:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // topo.world))
    return topo, device


def leave() -> None:
    """Destroy the process group `init` joined (none other): its gloo or NCCL threads stop here, while the
    process is whole, instead of in the interpreter's teardown, where a rank once aborted ("terminate
    called without an active exception", exit -6) after its work was done; PyTorch asks for this before
    exit. A no-op when `init` made no group."""
    global _joined
    if _joined:
        import torch.distributed as td

        _joined = False
        if td.is_initialized():
            td.destroy_process_group()


def all_sum(values: list[float], topo: Topology, device: Any) -> list[float]:
    """Element-wise sums over all ranks (the values themselves for a world of 1)."""
    if not topo.distributed:
        return values
    import torch
    import torch.distributed as td

    t = torch.tensor(values, dtype=torch.float64, device=device)
    td.all_reduce(t)
    return t.tolist()


def barrier(topo: Topology) -> None:
    if topo.distributed:
        import torch.distributed as td

        td.barrier()


def gather_objects(obj: Any, timeout_s: float = 12 * 3600) -> list[Any] | None:
    """Every rank's `obj`, in rank order, through a gloo group made for this call only (no NCCL):
    for summaries after work whose ranks may finish hours apart. None when not under torchrun or
    when the group cannot form (the caller reports its own rank only)."""
    topo = topology()
    if not topo.distributed or not topo.rendezvous:
        return None
    from datetime import timedelta

    import torch.distributed as td

    try:
        made = not td.is_initialized()
        if made:
            td.init_process_group(backend="gloo", timeout=timedelta(seconds=timeout_s))
        got: list[Any] = [None] * td.get_world_size()
        td.all_gather_object(got, obj)
        if made:
            td.destroy_process_group()
    except (RuntimeError, ValueError) as e:
        warn(f"could not gather the ranks' results ({e}); each rank reports only its own")
        return None
    return got
