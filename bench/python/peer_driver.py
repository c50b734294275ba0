"""What the Python peers of bench/gpt_fsdp.sh share (gpt_neox_ddp.py, llama_ddp.py): the
per-name seeds of trainyard's Note [Per-name initialisation], the causal-LM loss, and the job
itself: the flags, the data (step s trains on the global windows [s * W * B, (s + 1) * W * B) of
a file's bytes, rank r on its B of them), torch DDP over Gloo (or, with --parallel fsdp2,
PyTorch's FSDP2: fully_shard on each decoder layer and the root, on a CPU mesh over Gloo) with
AdamW(lr, eps 1e-8), and the lines the C++ example prints, so that one parser reads both. A peer
passes its presets, its Config, its model class and its initialiser to run().
"""

import argparse
import os
import resource
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

IGNORE_INDEX = -100  # models::kIgnoreIndex
MASK64 = (1 << 64) - 1


def splitmix64(x):
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def parameter_seed(seed, name):
    """FNV-1a of the name mixed with the model's seed."""
    h = 14695981039346656037
    for ch in name.encode():
        h = ((h ^ ch) * 1099511628211) & MASK64
    return splitmix64(h ^ splitmix64(seed))


def causal_lm_loss(logits, labels):
    """Mean cross entropy (fp32) of logits[:, :-1] against labels[:, 1:] (models::causal_lm_loss)."""
    shifted = logits[:, :-1].float().reshape(-1, logits.size(2))
    return F.cross_entropy(shifted, labels[:, 1:].reshape(-1), ignore_index=IGNORE_INDEX)


def parse_args(description, presets, default_preset):
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--preset", default=default_preset, choices=sorted(presets))
    p.add_argument("--precision", default="fp32", choices=["fp32", "bf16-mixed"])
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=4, help="sequences per rank")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--data", default=None, help="train on this file's bytes")
    p.add_argument("--threads", type=int, default=1, help="intra-op threads per rank")
    p.add_argument("--parallel", default="ddp", choices=["ddp", "fsdp2"],
                   help="DistributedDataParallel, or FSDP2's fully_shard (FULL_SHARD: "
                        "reshard_after_forward) on every decoder layer and the root")
    p.add_argument("--profile", metavar="FILE",
                   help="rank 0 records step 1 with torch.profiler and writes its Chrome trace here")
    p.add_argument("--phase-times", action="store_true",
                   help="rank 0 also prints the mean forward/backward/optimizer ms of steps 1..")
    a = p.parse_args()
    if not 2 <= a.seq_len <= 1 << 16 or a.batch_size < 1 or a.steps < 1 or a.threads < 1:
        p.error("--seq-len must be in [2, 65536], --batch-size, --steps and --threads >= 1")
    longest = presets[a.preset].get("max_position_embeddings")
    if longest is not None and a.seq_len > longest:
        p.error(f"--seq-len {a.seq_len} exceeds {a.preset}'s max_position_embeddings ({longest})")
    if a.seed < 0:
        p.error("--seed must be >= 0")
    if a.profile is not None and a.steps < 2:
        p.error("--profile records step 1: it needs --steps >= 2")
    if a.data is not None and not os.path.isfile(a.data):
        p.error(f"--data {a.data}: no such file")
    return a


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def load_tokens(args, vocab_size, program):
    if args.data is not None:
        with open(args.data, "rb") as f:
            raw = bytearray(f.read())
        if len(raw) <= args.seq_len:
            sys.exit(f"{program}: --data {args.data} has {len(raw)} bytes; it needs more "
                     f"than --seq-len ({args.seq_len}).")
        return torch.frombuffer(raw, dtype=torch.uint8).to(torch.int64)
    g = torch.Generator().manual_seed(args.seed + 1)
    return torch.randint(0, vocab_size, (1 << 20,), generator=g, dtype=torch.int64)


def fully_shard_layers(model, world, bf16):
    """FSDP2 as torchtitan applies it: one unit per decoder layer (the ModuleList named "layers"),
    then the root for the embeddings, the final norm and the output projection."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh("cpu", (world,))
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16 if bf16 else None,
                                  reduce_dtype=torch.float32)
    layers = [m for name, m in model.named_modules() if name.endswith("layers")]
    if len(layers) != 1:
        raise RuntimeError(f"expected one ModuleList named 'layers' in {type(model).__name__}")
    for layer in layers[0]:
        fully_shard(layer, mesh=mesh, mp_policy=policy)
    return fully_shard(model, mesh=mesh, mp_policy=policy)


def run(*, program, description, presets, common, default_preset, config_class, model_class,
        init_parameters):
    """The peer's whole job: parse the flags, build and train the model, print the lines."""
    args = parse_args(description, presets, default_preset)
    if "WORLD_SIZE" not in os.environ:  # one rank on its own
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1")
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(free_port()))
    dist.init_process_group("gloo", init_method="env://")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(args.threads)

    # The model, the same initial values on every rank (DDP broadcasts rank 0's anyway; FSDP2
    # keeps each rank's shard of them).
    config = config_class(**presets[args.preset], **common)
    model = model_class(config)
    init_parameters(model, config, args.seed)
    bf16 = args.precision == "bf16-mixed"
    state = sum(p.numel() for p in model.parameters()) * 4 * 4  # fp32 param, grad, two moments
    if args.parallel == "fsdp2":
        wrapped = fully_shard_layers(model, world, bf16)
        state //= world  # each rank owns 1/world of every parameter, as FULL_SHARD
    else:
        wrapped = DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(wrapped.parameters(), lr=args.lr, eps=1e-8)
    # bf16-mixed: DDP runs forward under CPU autocast; FSDP2 holds bf16 parameters for compute
    # (MixedPrecisionPolicy) and reduces in fp32, as trainyard's FSDP does.
    autocast = bf16 and args.parallel == "ddp"

    tokens = load_tokens(args, config.vocab_size, program)
    seq, batch = args.seq_len, args.batch_size
    windows = (tokens.numel() - 1) // seq

    phases = [0.0, 0.0, 0.0]  # forward (incl. loss), backward (incl. DDP's all-reduces), optimizer
    start = time.perf_counter()
    for step in range(args.steps):
        rows = [tokens[w * seq:(w + 1) * seq]
                for w in (((step * world + rank) * batch + i) % windows for i in range(batch))]
        ids = torch.stack(rows)  # (batch, seq_len)
        t0 = time.perf_counter()
        profiling = args.profile is not None and step == 1 and rank == 0
        profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
        if profiling:
            profiler.start()
        optimizer.zero_grad()
        with torch.autocast(device_type="cpu", dtype=torch.bfloat16, enabled=autocast):
            logits = wrapped(ids)
        loss = causal_lm_loss(logits, ids)
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        optimizer.step()
        t3 = time.perf_counter()
        if profiling:
            profiler.stop()
            profiler.export_chrome_trace(args.profile)
        if step > 0:
            phases = [phases[0] + t1 - t0, phases[1] + t2 - t1, phases[2] + t3 - t2]
        mean = loss.detach().clone() / world
        dist.all_reduce(mean)
        if rank == 0:
            print(f"step {step} loss {mean.item():.6f}", flush=True)
    seconds = time.perf_counter() - start

    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    if args.phase_times and rank == 0 and args.steps > 1:
        n = args.steps - 1
        print(f"rank 0 phases (mean of steps 1..{n}): forward {1e3 * phases[0] / n:.1f} ms, "
              f"backward {1e3 * phases[1] / n:.1f} ms, optimizer {1e3 * phases[2] / n:.1f} ms",
              flush=True)
    print(f"rank {rank}: {args.steps * batch * seq * world / seconds:.1f} tokens/s, peak RSS "
          f"{peak_kib / 1024.0:.1f} MiB, model state {state / 1048576.0:.1f} MiB "
          f"(python-{args.parallel}, {args.precision})", flush=True)
    dist.barrier()
    dist.destroy_process_group()
