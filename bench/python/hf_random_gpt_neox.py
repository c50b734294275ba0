"""Writes a randomly initialised GPT-NeoX as a Hugging Face folder (config.json, model.safetensors)
for loading benchmarks, without transformers: the safetensors file is written tensor by tensor as
the format specifies. Debian's python3-torch.

usage: hf_random_gpt_neox.py OUT_DIR [pythia-410m|pythia-160m|pythia-70m] [F32|BF16]
"""
import json
import os
import struct
import sys

import torch

out, preset = sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "pythia-410m"
dtype_name = sys.argv[3] if len(sys.argv) > 3 else "F32"
dtype = {"F32": torch.float32, "BF16": torch.bfloat16}[dtype_name]
V, H, L, NH, I = {"pythia-70m": (50304, 512, 6, 8, 2048), "pythia-160m": (50304, 768, 12, 12, 3072),
                  "pythia-410m": (50304, 1024, 24, 16, 4096)}[preset]
config = {"model_type": "gpt_neox", "architectures": ["GPTNeoXForCausalLM"], "vocab_size": V,
          "hidden_size": H, "num_hidden_layers": L, "num_attention_heads": NH,
          "intermediate_size": I, "rotary_pct": 0.25, "rotary_emb_base": 10000,
          "max_position_embeddings": 2048, "layer_norm_eps": 1e-5, "use_parallel_residual": True,
          "hidden_act": "gelu", "tie_word_embeddings": False}
shapes = {"gpt_neox.embed_in.weight": [V, H]}
for l in range(L):
    p = f"gpt_neox.layers.{l}."
    for n in ("input_layernorm", "post_attention_layernorm"):
        shapes[p + n + ".weight"], shapes[p + n + ".bias"] = [H], [H]
    shapes[p + "attention.query_key_value.weight"], shapes[p + "attention.query_key_value.bias"] = [3 * H, H], [3 * H]
    shapes[p + "attention.dense.weight"], shapes[p + "attention.dense.bias"] = [H, H], [H]
    shapes[p + "mlp.dense_h_to_4h.weight"], shapes[p + "mlp.dense_h_to_4h.bias"] = [I, H], [I]
    shapes[p + "mlp.dense_4h_to_h.weight"], shapes[p + "mlp.dense_4h_to_h.bias"] = [H, I], [H]
shapes["gpt_neox.final_layer_norm.weight"], shapes["gpt_neox.final_layer_norm.bias"] = [H], [H]
shapes["embed_out.weight"] = [V, H]

size = torch.tensor([], dtype=dtype).element_size()
header, offset = {"__metadata__": {"format": "pt"}}, 0
for name, shape in shapes.items():
    n = 1
    for d in shape:
        n *= d
    header[name] = {"dtype": dtype_name, "shape": shape, "data_offsets": [offset, offset + n * size]}
    offset += n * size
head = json.dumps(header).encode()
head += b" " * (-len(head) % 8)
os.makedirs(out, exist_ok=True)
gen = torch.Generator().manual_seed(0)
with open(os.path.join(out, "model.safetensors"), "wb") as f:
    f.write(struct.pack("<Q", len(head)) + head)
    for name, shape in shapes.items():
        t = (torch.randn(*shape, generator=gen) * 0.02).to(dtype).contiguous()
        f.write(t.view(torch.uint8).numpy().tobytes() if dtype != torch.float32 else t.numpy().tobytes())
with open(os.path.join(out, "config.json"), "w") as f:
    json.dump(config, f)
print(f"{out}: {preset}, {dtype_name}, {offset / 1e9:.2f} GB of weights")
