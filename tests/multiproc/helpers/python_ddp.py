"""A plain PyTorch DDP script, written for torchrun, that must run unchanged under `trainyard run`.

It reads the torchrun environment (init_process_group from env://), trains a small nn.Linear for
three steps under DistributedDataParallel with different data on each rank, and checks that:
  - an all_reduce of (rank + 1) sums to world_size * (world_size + 1) / 2, and
  - the DDP weights equal a single-process model trained on every rank's batch together, which
    only holds when the gradients were averaged across all ranks.
It prints one line per rank and exits non-zero on any mismatch.

With TY_FAIL_RANK_ON_FIRST_ATTEMPT=R, rank R exits with code 3 right after joining the group in
the first attempt (TORCHELASTIC_RESTART_COUNT=0), so that the agent has to restart the job.
"""

import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

STEPS = 3
BATCH = 8


def batch_of(rank: int, step: int):
    gen = torch.Generator().manual_seed(1000 + 100 * rank + step)
    return torch.randn(BATCH, 4, generator=gen), torch.randn(BATCH, 2, generator=gen)


def train(model, batches):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in batches:
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()


def main() -> int:
    dist.init_process_group("gloo")  # RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT from the env
    rank, world = dist.get_rank(), dist.get_world_size()
    assert rank == int(os.environ["RANK"]), (rank, os.environ["RANK"])
    assert world == int(os.environ["WORLD_SIZE"]), (world, os.environ["WORLD_SIZE"])
    fail_rank = os.environ.get("TY_FAIL_RANK_ON_FIRST_ATTEMPT")
    if fail_rank == str(rank) and os.environ.get("TORCHELASTIC_RESTART_COUNT") == "0":
        print(f"rank {rank} fails on purpose in the first attempt", flush=True)
        return 3

    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(4, 2))
    train(model, [batch_of(rank, step) for step in range(STEPS)])

    # The reference: one process, the same initial weights, every rank's batch at once. With equal
    # batch sizes the mean loss over the union has the mean of the ranks' gradients.
    torch.manual_seed(0)
    reference = torch.nn.Linear(4, 2)
    full = []
    for step in range(STEPS):
        parts = [batch_of(r, step) for r in range(world)]
        full.append((torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])))
    train(reference, full)
    matches = all(
        torch.allclose(a, b, atol=1e-6)  # float32 summation order differs between the two
        for a, b in zip(model.module.parameters(), reference.parameters())
    )

    total = torch.tensor([float(rank + 1)])
    dist.all_reduce(total)
    ok = matches and total.item() == world * (world + 1) / 2
    print(f"rank {rank}/{world} all_reduce sum={total.item():g} ddp_matches_full_batch={matches}",
          flush=True)
    dist.barrier()
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
