"""Data-parallel training of the block drafter over the GPUs of one host.

    python3 -m torch.distributed.run --standalone --nproc_per_node 2 \
        -m training.block --out /tmp/block --seed 0 --device cuda ...

Started by `torch.distributed.run` (its WORLD_SIZE, RANK and LOCAL_RANK), each process:

- runs on GPU LOCAL_RANK and answers its own shard of the prompt corpus (prompts i with
  i % WORLD_SIZE == RANK; with --data-in, the merged rows i % WORLD_SIZE == RANK), so no
  answers or hidden states cross between GPUs;
- keeps the hidden states of its own rows only (cached features fit: each GPU holds 1/N);
- trains the same drafter: parameters broadcast from rank 0 at the start, gradients summed
  over the ranks and divided by their number after every backward (one all-reduce of the
  flattened gradients), so every rank takes the same optimizer step from the mean gradient
  of world x batch sequences;
- follows rank 0 on when to stop and on the learning rate's clock (one broadcast a step).

Rank 0 alone validates, keeps the best checkpoint and writes the weights. With one process
(no WORLD_SIZE) nothing here does anything and training is what it was.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass
class Dist:
    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def on(self) -> bool:
        return self.world > 1

    @classmethod
    def from_env(cls) -> "Dist":
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if world <= 1:
            return cls()
        return cls(int(os.environ["RANK"]), world, int(os.environ.get("LOCAL_RANK", "0")))

    def start(self, device: str | None) -> str | None:
        """Joins the process group; returns this rank's device (cuda:LOCAL_RANK for cuda)."""
        if not self.on:
            return device
        cuda = (device or ("cuda" if torch.cuda.is_available() else "cpu")).startswith("cuda")
        if cuda:
            torch.cuda.set_device(self.local_rank)
            device = f"cuda:{self.local_rank}"
        if not dist.is_initialized():
            dist.init_process_group("nccl" if cuda else "gloo")
        return device

    def shard(self) -> str:
        """This rank's --prompt-shard ("" with one process)."""
        return f"{self.rank}/{self.world}" if self.on else ""

    def broadcast_params(self, module: torch.nn.Module) -> None:
        if self.on:
            with torch.no_grad():
                for p in module.parameters():
                    dist.broadcast(p.data, 0)

    def mean_grads(self, params: list[torch.Tensor]) -> None:
        """Every rank's gradients become the mean over the ranks (one flat all-reduce)."""
        if not self.on:
            return
        grads = [p.grad for p in params if p.grad is not None]
        if len(grads) != len(params):
            raise RuntimeError("a parameter without a gradient on this rank: the ranks' "
                               "all-reduces would not line up")
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat)
        flat /= self.world
        off = 0
        for g in grads:
            g.copy_(flat[off:off + g.numel()].view_as(g))
            off += g.numel()

    def agree(self, stop: bool, frac: float, device) -> tuple[bool, float]:
        """Rank 0's (stop, learning-rate clock) for every rank."""
        if not self.on:
            return stop, frac
        t = torch.tensor([float(stop), frac], dtype=torch.float64, device=device)
        dist.broadcast(t, 0)
        return bool(t[0] > 0.5), float(t[1])

    def gather(self, obj) -> list:
        """[obj of rank 0, obj of rank 1, ...] on every rank."""
        if not self.on:
            return [obj]
        out = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    def same_weights(self, module: torch.nn.Module) -> bool:
        """True when every rank's per-parameter sums equal rank 0's bit for bit (a checksum
        of the weights, checked at the end)."""
        if not self.on:
            return True
        with torch.no_grad():
            s = torch.stack([p.detach().double().sum() for p in module.parameters()])
            mine = s.clone()
            dist.broadcast(s, 0)
            ok = torch.tensor([float(torch.equal(s, mine))], device=s.device)
            dist.all_reduce(ok, op=dist.ReduceOp.MIN)
        return bool(ok.item() > 0.5)

    def barrier(self) -> None:
        if self.on:
            dist.barrier()

    def close(self) -> None:
        if self.on and dist.is_initialized():
            dist.destroy_process_group()
