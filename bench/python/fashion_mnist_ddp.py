#!/opt/trainyard/venv/bin/python
"""The Python PyTorch peer of `trainyard train fashion-mnist`: the same job in plain PyTorch DDP.

torchvision ResNet18 (conv1 = Conv2d(1, 64, 7, stride 2, padding 3, bias=False), 10 classes) on
FashionMNIST read straight from Debian's IDX files, images normalised (x/255 - 0.5)/0.5, Adam,
DistributedSampler(shuffle, seed) + DataLoader(num_workers=0) per rank, DistributedDataParallel
over Gloo, then a test-set evaluation summed across ranks. Rank 0 writes a JSON result with the
keys of trainyard's result.json; train_samples_per_s is measured the same way: samples trained by
all ranks / the slowest rank's training time (training epochs only: no startup, no evaluation).

Run it with Debian's interpreter (it has torch 1.13 + torchvision; Debian's torchrun is broken on
Python 3.11, so launch the ranks with trainyard, which sets the torchrun environment contract):

  build/trainyard run --nproc-per-node 2 -- /opt/trainyard/venv/bin/python bench/python/fashion_mnist_ddp.py \
      --epochs 1 --batch-size 128 --lr 0.001 --limit 6000 --threads 1 --seed 0 --out /tmp/py.json

or by hand, one process per rank, with RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT set.
Without WORLD_SIZE it runs as a single rank on a free local port.
"""

import argparse
import gzip
import json
import os
import socket
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
import torchvision
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

DATA_DIR = "/usr/share/datasets/fashion-mnist"
EVAL_BATCH = 512  # as the recipe's evaluation


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=128, help="batch size per rank")
    p.add_argument("--lr", type=float, default=1e-3, help="Adam learning rate")
    p.add_argument("--limit", type=int, default=-1, help="use the first N training images (-1: all)")
    p.add_argument("--threads", type=int, default=0,
                   help="intra-op threads per rank (0: cores / local ranks)")
    p.add_argument("--seed", type=int, default=0, help="seed for initialisation and shuffling")
    p.add_argument("--data-dir", default=DATA_DIR, help="folder with the FashionMNIST IDX .gz files")
    p.add_argument("--out", default=None, help="rank 0 writes the JSON result here")
    a = p.parse_args()
    if a.epochs < 1 or a.batch_size < 1 or a.lr <= 0 or a.threads < 0:
        p.error("--epochs and --batch-size must be >= 1, --lr > 0, --threads >= 0")
    if a.limit != -1 and a.limit < 1:
        p.error("--limit must be >= 1 (or -1 for all images)")
    return a


def read_idx(path):
    """An IDX file (optionally gzipped) as a numpy array of its declared shape (uint8 data)."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        raw = f.read()
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] != 0x08:
        raise ValueError(f"{path}: not an unsigned-byte IDX file")
    ndim = raw[3]
    dims = [int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim)]
    data = np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim)
    if data.size != int(np.prod(dims)):
        raise ValueError(f"{path}: {data.size} bytes of data, the header says {dims}")
    return data.reshape(dims)


def load_split(data_dir, prefix, limit=-1):
    """(N, 1, 28, 28) float32 images normalised to [-1, 1] and (N,) int64 labels."""
    images = read_idx(os.path.join(data_dir, f"{prefix}-images-idx3-ubyte.gz"))
    labels = read_idx(os.path.join(data_dir, f"{prefix}-labels-idx1-ubyte.gz"))
    if limit > 0:
        images, labels = images[:limit], labels[:limit]
    x = torch.from_numpy(images.astype(np.float32)).unsqueeze(1)
    x = (x / 255.0 - 0.5) / 0.5
    y = torch.from_numpy(labels.astype(np.int64))
    return x, y


def make_model():
    model = torchvision.models.resnet18(num_classes=10)
    model.conv1 = torch.nn.Conv2d(1, 64, kernel_size=7, stride=2, padding=3, bias=False)
    return model


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    args = parse_args()
    start = time.perf_counter()
    if "WORLD_SIZE" not in os.environ:  # one rank on its own
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1")
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(free_port()))
    dist.init_process_group("gloo", init_method="env://")
    rank, world = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))

    threads = args.threads or max(1, (os.cpu_count() or 1) // max(1, local_world))
    torch.set_num_threads(threads)

    train_x, train_y = load_split(args.data_dir, "train", args.limit)
    test_x, test_y = load_split(args.data_dir, "t10k")
    config = {"recipe": "fashion-mnist", "implementation": "python",
              "model": "resnet18 (1-channel 7x7 conv1, 10 classes)", "world_size": world,
              "epochs": args.epochs, "batch_size": args.batch_size, "lr": args.lr,
              "optimizer": "Adam", "limit": args.limit, "threads_per_rank": threads,
              "seed": args.seed, "data_dir": args.data_dir,
              "torch": torch.__version__, "torchvision": torchvision.__version__}

    torch.manual_seed(args.seed)
    model = make_model()
    ddp_model = DistributedDataParallel(model)  # broadcasts rank 0's parameters and buffers
    optimizer = torch.optim.Adam(ddp_model.parameters(), lr=args.lr)

    train_set = TensorDataset(train_x, train_y)
    sampler = DistributedSampler(train_set, num_replicas=world, rank=rank, shuffle=True,
                                 seed=args.seed)
    loader = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler, num_workers=0)

    train_time = 0.0
    samples_seen = 0  # this rank
    for epoch in range(args.epochs):
        epoch_start = time.perf_counter()
        sampler.set_epoch(epoch)
        ddp_model.train()
        steps = 0
        for x, y in loader:
            optimizer.zero_grad()
            loss = F.cross_entropy(ddp_model(x), y)
            loss.backward()
            optimizer.step()
            samples_seen += x.size(0)
            steps += 1
        epoch_time = time.perf_counter() - epoch_start
        train_time += epoch_time
        print(f"[Epoch {epoch} | CPU{local_rank}: Process rank {rank} | Batchsize: "
              f"{args.batch_size} | Steps: {steps} | Total epoch time: {epoch_time:.4f}]",
              flush=True)

    # Evaluation: rank r takes test images r, r+W, ...; the sums are all-reduced, so every image
    # counts exactly once (as the recipe does it).
    model.eval()
    loss_sum = correct = count = 0.0
    with torch.no_grad():
        mine = torch.arange(rank, test_x.size(0), world)
        for b in range(0, mine.numel(), EVAL_BATCH):
            idx = mine[b:b + EVAL_BATCH]
            logits = model(test_x[idx])
            loss_sum += F.cross_entropy(logits, test_y[idx], reduction="sum").item()
            correct += (logits.argmax(1) == test_y[idx]).sum().item()
            count += idx.numel()
    totals = torch.tensor([loss_sum, correct, count, float(samples_seen)], dtype=torch.float64)
    dist.all_reduce(totals)  # SUM
    slowest = torch.tensor([train_time], dtype=torch.float64)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)

    loss_mean = totals[0].item() / totals[2].item()
    accuracy = totals[1].item() / totals[2].item()
    train_time_s = slowest.item()
    samples_per_s = totals[3].item() / train_time_s
    if rank == 0:
        total_s = time.perf_counter() - start
        result = {"loss": loss_mean, "accuracy": accuracy, "time_this_iter_s": total_s,
                  "time_total_s": total_s, "training_iteration": 1,
                  "checkpoint_dir_name": None,  # the peer saves no checkpoint
                  "train_time_s": train_time_s, "train_samples_per_s": samples_per_s,
                  "world_size": world, "config": config}
        if args.out:
            os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
            tmp = args.out + ".tmp"
            with open(tmp, "w") as f:
                json.dump(result, f, indent=2)
                f.write("\n")
            os.replace(tmp, args.out)
        print(f"test accuracy {accuracy:.4f}, loss {loss_mean:.5f}; {samples_per_s:.1f} training "
              f"samples/s over {train_time_s:.3f} s" + (f"; result in {args.out}" if args.out else ""),
              flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        sys.exit(130)
