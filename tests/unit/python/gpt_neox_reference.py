"""An independent GPT-NeoX for the C++ loader's tests (torch alone, no transformers).

Writes into OUT_DIR a tiny model as another implementation would ship it: config.json, the weights
as model.safetensors (written byte by byte as the format specifies, in DTYPE) in OUT_DIR/safetensors
and as pytorch_model.bin (torch.save) in OUT_DIR/bin, the input ids (ids.i64, little-endian int64)
and the logits of this file's own forward pass (logits.f32, little-endian float32), computed from
the stored (rounded) weights in float64 so the reference itself adds no error.

usage: gpt_neox_reference.py OUT_DIR [f32|bf16|f16]
"""
import json
import math
import os
import struct
import sys

import torch

out = sys.argv[1]
dtype = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}[
    sys.argv[2] if len(sys.argv) > 2 else "f32"]
st_name = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16"}[dtype]

config = {"model_type": "gpt_neox", "architectures": ["GPTNeoXForCausalLM"],
          "vocab_size": 72, "hidden_size": 24, "num_hidden_layers": 2,
          "num_attention_heads": 3, "intermediate_size": 40, "rotary_pct": 0.5,
          "rotary_emb_base": 10000, "max_position_embeddings": 32, "layer_norm_eps": 1e-5,
          "use_parallel_residual": True, "hidden_act": "gelu", "tie_word_embeddings": False}
V, H, L = config["vocab_size"], config["hidden_size"], config["num_hidden_layers"]
NH, I = config["num_attention_heads"], config["intermediate_size"]
HS = H // NH
RD = int(HS * config["rotary_pct"])

gen = torch.Generator().manual_seed(1234)
def rand(*shape, scale=0.3):
    return (torch.randn(*shape, generator=gen) * scale).to(dtype)

weights = {"gpt_neox.embed_in.weight": rand(V, H, scale=1.0)}
for l in range(L):
    p = f"gpt_neox.layers.{l}."
    weights[p + "input_layernorm.weight"] = (1 + rand(H, scale=0.1).float()).to(dtype)
    weights[p + "input_layernorm.bias"] = rand(H, scale=0.1)
    weights[p + "post_attention_layernorm.weight"] = (1 + rand(H, scale=0.1).float()).to(dtype)
    weights[p + "post_attention_layernorm.bias"] = rand(H, scale=0.1)
    weights[p + "attention.query_key_value.weight"] = rand(3 * H, H)
    weights[p + "attention.query_key_value.bias"] = rand(3 * H, scale=0.1)
    weights[p + "attention.dense.weight"] = rand(H, H)
    weights[p + "attention.dense.bias"] = rand(H, scale=0.1)
    weights[p + "mlp.dense_h_to_4h.weight"] = rand(I, H)
    weights[p + "mlp.dense_h_to_4h.bias"] = rand(I, scale=0.1)
    weights[p + "mlp.dense_4h_to_h.weight"] = rand(H, I)
    weights[p + "mlp.dense_4h_to_h.bias"] = rand(H, scale=0.1)
weights["gpt_neox.final_layer_norm.weight"] = (1 + rand(H, scale=0.1).float()).to(dtype)
weights["gpt_neox.final_layer_norm.bias"] = rand(H, scale=0.1)
weights["embed_out.weight"] = rand(V, H)

# safetensors: 8-byte little-endian header size, the JSON header, then the raw tensors.
os.makedirs(f"{out}/safetensors", exist_ok=True)
header, blobs, offset = {"__metadata__": {"format": "pt"}}, [], 0
for name, t in weights.items():
    raw = t.contiguous().view(torch.uint8).numpy().tobytes() if dtype != torch.float32 \
        else t.contiguous().numpy().tobytes()
    header[name] = {"dtype": st_name, "shape": list(t.shape), "data_offsets": [offset, offset + len(raw)]}
    blobs.append(raw)
    offset += len(raw)
head = json.dumps(header).encode()
head += b" " * (-len(head) % 8)
with open(f"{out}/safetensors/model.safetensors", "wb") as f:
    f.write(struct.pack("<Q", len(head)) + head + b"".join(blobs))
os.makedirs(f"{out}/bin", exist_ok=True)
torch.save(weights, f"{out}/bin/pytorch_model.bin")
for d in ("safetensors", "bin"):
    with open(f"{out}/{d}/config.json", "w") as f:
        json.dump(config, f)

# The reference forward, in float64 from the stored values.
w = {k: v.to(torch.float64) for k, v in weights.items()}
ids = torch.randint(0, V, (2, 11), generator=gen)
def layer_norm(x, p):
    return torch.nn.functional.layer_norm(x, (H,), w[p + ".weight"], w[p + ".bias"], 1e-5)
def linear(x, p):
    return x @ w[p + ".weight"].T + w[p + ".bias"]
def rotate_half(x):
    return torch.cat([-x[..., x.shape[-1] // 2:], x[..., : x.shape[-1] // 2]], dim=-1)
B, T = ids.shape
inv_freq = 1.0 / (config["rotary_emb_base"] ** (torch.arange(0, RD, 2, dtype=torch.float64) / RD))
emb = torch.cat([torch.outer(torch.arange(T, dtype=torch.float64), inv_freq)] * 2, dim=-1)
cos, sin = emb.cos(), emb.sin()
x = w["gpt_neox.embed_in.weight"][ids]
for l in range(L):
    p = f"gpt_neox.layers.{l}."
    qkv = linear(layer_norm(x, p + "input_layernorm"), p + "attention.query_key_value")
    qkv = qkv.view(B, T, NH, 3 * HS).permute(0, 2, 1, 3)
    q, k, v = qkv[..., :HS], qkv[..., HS:2 * HS], qkv[..., 2 * HS:]
    q = torch.cat([q[..., :RD] * cos + rotate_half(q[..., :RD]) * sin, q[..., RD:]], dim=-1)
    k = torch.cat([k[..., :RD] * cos + rotate_half(k[..., :RD]) * sin, k[..., RD:]], dim=-1)
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(HS)
    scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    attn = (scores.softmax(-1) @ v).permute(0, 2, 1, 3).reshape(B, T, H)
    attn = linear(attn, p + "attention.dense")
    h = linear(layer_norm(x, p + "post_attention_layernorm"), p + "mlp.dense_h_to_4h")
    mlp = linear(torch.nn.functional.gelu(h), p + "mlp.dense_4h_to_h")
    x = x + attn + mlp
x = layer_norm(x, "gpt_neox.final_layer_norm")
logits = x @ w["embed_out.weight"].T
ids.numpy().astype("<i8").tofile(f"{out}/ids.i64")
logits.to(torch.float32).numpy().astype("<f4").tofile(f"{out}/logits.f32")
