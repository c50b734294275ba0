"""An independent Llama for the C++ model's tests (torch alone, no transformers).

Writes into OUT_DIR one folder per variant, each a tiny model as Hugging Face ships one:
config.json, model.safetensors (f32, written byte by byte as the format specifies), the input ids
(ids.i64), the logits of this file's own forward pass (logits.f32, computed in float64 from the
stored weights) and the greedy continuation of the first row's first 5 ids (greedy.i64).
Variants: gqa (grouped-query attention), tied (tie_word_embeddings), qwen2 (q/k/v biases, no
o_proj bias, head_dim larger than hidden / heads), llama3 (rope_scaling llama3 with wavelengths
on both sides of its band), linear (rope_scaling linear, mlp_bias), mistral (sliding_window null).

usage: llama_reference.py OUT_DIR
"""
import json
import math
import os
import struct
import sys

import torch

out = sys.argv[1]
BASE = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
        "vocab_size": 67, "hidden_size": 24, "intermediate_size": 40, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64,
        "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": False}
VARIANTS = {
    "gqa": {},
    "tied": {"num_key_value_heads": 4, "tie_word_embeddings": True},
    "qwen2": {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "head_dim": 8,
              "num_key_value_heads": 1, "use_sliding_window": False, "sliding_window": 16},
    "llama3": {"rope_theta": 10000.0, "hidden_size": 32, "num_attention_heads": 4,
               "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                "high_freq_factor": 4.0, "original_max_position_embeddings": 64}},
    "linear": {"rope_scaling": {"type": "linear", "factor": 4.0}, "mlp_bias": True},
    "mistral": {"architectures": ["MistralForCausalLM"], "model_type": "mistral",
                "sliding_window": None},
}


def inv_freq(c, d):
    f = 1.0 / (c["rope_theta"] ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    rs = c.get("rope_scaling") or {}
    kind = rs.get("rope_type", rs.get("type"))
    if kind == "linear":
        return f / rs["factor"]
    if kind == "llama3":
        old, lo, hi, k = (rs["original_max_position_embeddings"], rs["low_freq_factor"],
                          rs["high_freq_factor"], rs["factor"])
        out = []
        for x in f.tolist():
            wavelen = 2 * math.pi / x
            if wavelen < old / hi:
                out.append(x)
            elif wavelen > old / lo:
                out.append(x / k)
            else:
                s = (old / wavelen - lo) / (hi - lo)
                out.append((1 - s) * x / k + s * x)
        return torch.tensor(out, dtype=torch.float64)
    return f


def build(name, overrides, gen):
    c = dict(BASE)
    c.update(overrides)
    V, H, I, L = c["vocab_size"], c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"]
    NH, KV = c["num_attention_heads"], c["num_key_value_heads"]
    D = c.get("head_dim", H // NH)
    qwen = c["model_type"] == "qwen2"
    qkv_bias = qwen or c.get("attention_bias", False)
    mlp_bias = c.get("mlp_bias", False)

    def rand(*shape, scale=0.3):
        return torch.randn(*shape, generator=gen) * scale

    w = {"model.embed_tokens.weight": rand(V, H, scale=1.0)}
    for l in range(L):
        p = f"model.layers.{l}."
        w[p + "self_attn.q_proj.weight"] = rand(NH * D, H)
        w[p + "self_attn.k_proj.weight"] = rand(KV * D, H)
        w[p + "self_attn.v_proj.weight"] = rand(KV * D, H)
        w[p + "self_attn.o_proj.weight"] = rand(H, NH * D)
        if qkv_bias:
            w[p + "self_attn.q_proj.bias"] = rand(NH * D, scale=0.1)
            w[p + "self_attn.k_proj.bias"] = rand(KV * D, scale=0.1)
            w[p + "self_attn.v_proj.bias"] = rand(KV * D, scale=0.1)
        w[p + "mlp.gate_proj.weight"] = rand(I, H)
        w[p + "mlp.up_proj.weight"] = rand(I, H)
        w[p + "mlp.down_proj.weight"] = rand(H, I)
        if mlp_bias:
            w[p + "mlp.gate_proj.bias"] = rand(I, scale=0.1)
            w[p + "mlp.up_proj.bias"] = rand(I, scale=0.1)
            w[p + "mlp.down_proj.bias"] = rand(H, scale=0.1)
        w[p + "input_layernorm.weight"] = 1 + rand(H, scale=0.1)
        w[p + "post_attention_layernorm.weight"] = 1 + rand(H, scale=0.1)
        # Older checkpoints stored the rotary buffer; loaders ignore it by name.
        if name == "gqa":
            w[p + "self_attn.rotary_emb.inv_freq"] = inv_freq(c, D).float()
    w["model.norm.weight"] = 1 + rand(H, scale=0.1)
    if not c["tie_word_embeddings"]:
        w["lm_head.weight"] = rand(V, H)

    d = f"{out}/{name}"
    os.makedirs(d, exist_ok=True)
    header, blobs, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for k, t in w.items():
        raw = t.float().contiguous().numpy().tobytes()
        header[k] = {"dtype": "F32", "shape": list(t.shape),
                     "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    head = json.dumps(header).encode()
    head += b" " * (-len(head) % 8)
    with open(f"{d}/model.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(head)) + head + b"".join(blobs))
    with open(f"{d}/config.json", "w") as f:
        json.dump(c, f)

    w64 = {k: v.float().double() for k, v in w.items()}
    freqs = inv_freq(c, D)

    def forward(ids):
        B, T = ids.shape

        def rms(x, p):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + c["rms_norm_eps"]) * w64[p]

        def lin(x, p):
            y = x @ w64[p + ".weight"].T
            return y + w64[p + ".bias"] if p + ".bias" in w64 else y

        def rot(x):
            return torch.cat([-x[..., D // 2:], x[..., :D // 2]], dim=-1)

        emb = torch.cat([torch.outer(torch.arange(T, dtype=torch.float64), freqs)] * 2, dim=-1)
        cos, sin = emb.cos(), emb.sin()
        x = w64["model.embed_tokens.weight"][ids]
        for l in range(L):
            p = f"model.layers.{l}."
            h = rms(x, p + "input_layernorm.weight")
            q = lin(h, p + "self_attn.q_proj").view(B, T, NH, D).transpose(1, 2)
            k = lin(h, p + "self_attn.k_proj").view(B, T, KV, D).transpose(1, 2)
            v = lin(h, p + "self_attn.v_proj").view(B, T, KV, D).transpose(1, 2)
            q, k = q * cos + rot(q) * sin, k * cos + rot(k) * sin
            k = k.repeat_interleave(NH // KV, dim=1)
            v = v.repeat_interleave(NH // KV, dim=1)
            s = (q @ k.transpose(-1, -2)) / math.sqrt(D)
            s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
            a = (s.softmax(-1) @ v).transpose(1, 2).reshape(B, T, NH * D)
            x = x + lin(a, p + "self_attn.o_proj")
            h = rms(x, p + "post_attention_layernorm.weight")
            g = lin(h, p + "mlp.gate_proj")
            x = x + lin(torch.nn.functional.silu(g) * lin(h, p + "mlp.up_proj"), p + "mlp.down_proj")
        x = rms(x, "model.norm.weight")
        head = w64["model.embed_tokens.weight"] if c["tie_word_embeddings"] else w64["lm_head.weight"]
        return x @ head.T

    ids = torch.randint(0, V, (2, 13), generator=gen)
    forward(ids).float().numpy().astype("<f4").tofile(f"{d}/logits.f32")
    ids.numpy().astype("<i8").tofile(f"{d}/ids.i64")
    seq = ids[:1, :5]
    for _ in range(8):
        nxt = forward(seq)[0, -1].argmax().view(1, 1)
        seq = torch.cat([seq, nxt], dim=1)
    seq[0, 5:].numpy().astype("<i8").tofile(f"{d}/greedy.i64")


gen = torch.Generator().manual_seed(4321)
for name, overrides in VARIANTS.items():
    build(name, overrides, gen)
