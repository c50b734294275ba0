#!/usr/bin/env python3
"""The PyTorch peer for trainyard's GPU benchmark (issue 14): GPT-NeoX training throughput under
PyTorch's own FSDP2 (torch.distributed.fsdp.fully_shard) and DDP, from the pip PyTorch on a GPU.

The model is Hugging Face's GPTNeoXForCausalLM (transformers), built from a config with random
weights (nothing is downloaded), with the same presets as trainyard's GptNeoXConfig:
  pythia-70m   hidden 512,  6 layers,  8 heads, MLP 2048, vocab 50304
  pythia-1b    hidden 2048, 16 layers, 8 heads, MLP 8192, vocab 50304
Mixed precision bf16: FSDP2 with MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32); DDP
under torch.autocast(cuda, bf16). AdamW(lr 1e-4). Random token ids, labels = inputs (HF shifts).

It prints one line per variant:
  peer MODE PRESET seq T batch B: X tokens/s, MFU M (peak P TFLOP/s), step S ms, peak mem G GiB
MFU = 6 x parameters x tokens/s / peak, peak = measured bf16 matmul (8192^3, random data, median).

Run one process per rank with RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set, or alone (W=1).
"""

import argparse
import os
import socket
import statistics
import time

import torch
import torch.distributed as dist


def presets():
    return {
        "pythia-14m": dict(hidden_size=128, num_hidden_layers=6, num_attention_heads=4,
                           intermediate_size=512),
        "pythia-70m": dict(hidden_size=512, num_hidden_layers=6, num_attention_heads=8,
                           intermediate_size=2048),
        "pythia-1b": dict(hidden_size=2048, num_hidden_layers=16, num_attention_heads=8,
                          intermediate_size=8192),
    }


def bf16_peak_tflops(n=8192, repeats=10):
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        a @ b
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return 2 * n ** 3 / statistics.median(times) / 1e12


def build(preset):
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM
    config = GPTNeoXConfig(vocab_size=50304, rotary_pct=0.25, max_position_embeddings=2048,
                           use_parallel_residual=True, tie_word_embeddings=False,
                           hidden_act="gelu", **presets()[preset])
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return GPTNeoXForCausalLM(config).cuda()


def run(mode, preset, seq, batch, steps, peak):
    model = build(preset)
    params = sum(p.numel() for p in model.parameters())
    autocast = False
    if mode == "fsdp2":
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for layer in model.gpt_neox.layers:
            fully_shard(layer, mp_policy=mp)
        fully_shard(model, mp_policy=mp)
    else:
        model = torch.nn.parallel.DistributedDataParallel(model)
        autocast = True
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    g = torch.Generator(device="cuda").manual_seed(1 + dist.get_rank())
    ids = torch.randint(0, 50304, (batch, seq), device="cuda", generator=g)
    torch.cuda.reset_peak_memory_stats()

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    for _ in range(2):
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        loss = step()
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    tokens = steps * batch * seq * dist.get_world_size()
    tps = tokens / dt
    mfu = 6 * params * tps / (peak * 1e12)
    if dist.get_rank() == 0:
        print(f"peer {mode} {preset} seq {seq} batch {batch}: {tps:.0f} tokens/s, MFU {mfu:.3f} "
              f"(peak {peak:.0f} TFLOP/s, {params} parameters), step {dt / steps * 1e3:.1f} ms, "
              f"peak mem {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB, "
              f"loss {loss.item():.3f}", flush=True)
    del model, opt
    torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--presets", default="pythia-70m,pythia-1b")
    ap.add_argument("--modes", default="fsdp2,ddp")
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--steps", type=int, default=10)
    args = ap.parse_args()
    if "WORLD_SIZE" not in os.environ:
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(s.getsockname()[1]), LOCAL_RANK="0")
        s.close()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl")
    peak = bf16_peak_tflops()
    if dist.get_rank() == 0:
        print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}, bf16 matmul peak "
              f"{peak:.0f} TFLOP/s", flush=True)
    for preset in args.presets.split(","):
        for mode in args.modes.split(","):
            try:
                run(mode, preset, args.seq_len, args.batch_size, args.steps, peak)
            except Exception as e:  # one failing variant (e.g. out of memory) leaves the others
                print(f"peer {mode} {preset}: failed: {type(e).__name__}: {e}"[:400], flush=True)
                torch.cuda.empty_cache()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
