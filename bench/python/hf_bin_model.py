"""Writes DIR/pytorch_model.bin with torch.save: LAYERS bf16 tensors of 2048 x 131072 (512 MiB
each; 9 make a ZIP64 archive past 4 GiB, as a 7B model's is), holding the values
hf_read_bench.cpp's value_at() gives, so `hf_read_bench read DIR RANK WORLD` can check them.

  /opt/trainyard/venv/bin/python bench/python/hf_bin_model.py DIR [LAYERS]
"""
import os
import sys

import torch

ROWS, COLS, CHUNK = 2048, 131072, 1 << 24


def values(tensor_index, n):
    """value_at(t, i) = ((((i + 1) * 2654435761) mod 2^32) ^ (t * 40503)) >> 8, * 2^-24 - 0.5."""
    out = torch.empty(n, dtype=torch.bfloat16)
    for begin in range(0, n, CHUNK):
        i = torch.arange(begin, min(n, begin + CHUNK), dtype=torch.int64)
        h = (((i + 1) * 2654435761) % (1 << 32)) ^ (tensor_index * 40503)
        out[begin:begin + len(i)] = ((h >> 8).to(torch.float32) * 2.0**-24 - 0.5).bfloat16()
    return out


def main():
    d = sys.argv[1]
    layers = int(sys.argv[2]) if len(sys.argv) > 2 else 9
    os.makedirs(d, exist_ok=True)
    sd = {f"layers.{l}.weight": values(l, ROWS * COLS).view(ROWS, COLS) for l in range(layers)}
    torch.save(sd, os.path.join(d, "pytorch_model.bin"))
    print(f"wrote {os.path.join(d, 'pytorch_model.bin')}: "
          f"{os.path.getsize(os.path.join(d, 'pytorch_model.bin'))} bytes")


if __name__ == "__main__":
    main()
