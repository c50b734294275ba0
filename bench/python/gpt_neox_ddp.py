#!/opt/trainyard/venv/bin/python
"""The Python PyTorch peer of examples/train_gpt_fsdp.cpp --strategy ddp: GPT-NeoX in plain torch.

The same architecture as include/trainyard/models/gpt_neox.h (Hugging Face's GPTNeoXForCausalLM:
fused per-head [q|k|v] projection, rotary embeddings on the first rotary_pct of each head, scores
and softmax in fp32, exact GELU MLP, parallel residual, untied embed_out), the same presets, the
same initial weights (each parameter drawn from its own generator seeded from (seed, name), as
Note [Per-name initialisation] does), the same data (step s trains on the global windows
[s * W * B, (s + 1) * W * B) of the file's bytes, rank r on its B of them), AdamW(lr, eps 1e-8,
torch's other defaults, which LibTorch's AdamWOptions shares), torch.nn.parallel.
DistributedDataParallel over Gloo with its defaults, 1 intra-op thread per rank. In fp32 its
losses equal the C++ example's up to summation order.

--precision bf16-mixed runs forward and loss under torch.autocast(device_type="cpu",
dtype=torch.bfloat16); parameters, gradients and AdamW stay fp32.

It prints what the C++ example prints, so one parser reads both:
  step N loss X                       (rank 0; X = the mean loss over all ranks' tokens)
  rank R: T tokens/s, peak RSS M MiB, model state S MiB (python-ddp, PRECISION)
tokens/s = steps * B * seq_len * W / this rank's seconds over all steps (the first included),
model state = 16 bytes (fp32 parameter, gradient, two AdamW moments) x parameters.
--phase-times adds, on rank 0, the mean forward / backward / optimizer time of steps 1.. .

Run it with Debian's interpreter (python3-torch 1.13; Debian's torchrun is broken on Python
3.11, so launch the ranks with trainyard, which sets the torchrun environment contract):

  build/trainyard run --nproc-per-node 2 -- /opt/trainyard/venv/bin/python bench/python/gpt_neox_ddp.py \
      --preset pythia-14m --seq-len 256 --batch-size 4 --steps 10 \
      --data /usr/share/games/fortunes/fortunes

or by hand, one process per rank, with RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT set.
Without WORLD_SIZE it runs as a single rank on a free local port.
"""

import math
import os
import sys

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # peer_driver.py beside this file
import peer_driver  # noqa: E402
from peer_driver import parameter_seed  # noqa: E402


# Hugging Face GPTNeoXConfig fields, as GptNeoXConfig::preset builds them (src/models/gpt_neox.cpp):
# pythia(vocab, hidden, layers, heads, intermediate) with rotary_pct 0.25, rotary_emb_base 10000,
# max_position_embeddings 2048, and the struct's defaults for the rest.
PRESETS = {
    "pythia-14m": dict(vocab_size=50304, hidden_size=128, num_hidden_layers=6,
                       num_attention_heads=4, intermediate_size=512),
    "pythia-70m": dict(vocab_size=50304, hidden_size=512, num_hidden_layers=6,
                       num_attention_heads=8, intermediate_size=2048),
    "pythia-160m": dict(vocab_size=50304, hidden_size=768, num_hidden_layers=12,
                        num_attention_heads=12, intermediate_size=3072),
    "pythia-410m": dict(vocab_size=50304, hidden_size=1024, num_hidden_layers=24,
                        num_attention_heads=16, intermediate_size=4096),
}
COMMON = dict(rotary_pct=0.25, rotary_emb_base=10000.0, max_position_embeddings=2048,
              layer_norm_eps=1e-5, use_parallel_residual=True, initializer_range=0.02)


class Config:
    def __init__(self, **fields):
        self.__dict__.update(fields)
        self.head_size = self.hidden_size // self.num_attention_heads
        self.rotary_ndims = int(self.head_size * self.rotary_pct)

    def parameter_count(self):
        h, v, i = self.hidden_size, self.vocab_size, self.intermediate_size
        layer = 2 * (2 * h) + (h * 3 * h + 3 * h) + (h * h + h) + (h * i + i) + (i * h + h)
        return v * h + self.num_hidden_layers * layer + 2 * h + v * h


# --- Note [Per-name initialisation], as src/models/gpt_neox.cpp computes it ---------------------
def init_parameters(model, config, seed):
    """Dense and Embedding weights ~ normal(0, initializer_range) from a CPU generator seeded per
    name (mt19937, as at::make_generator<CPUGeneratorImpl>(seed)), biases 0, LayerNorm weights 1."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".bias"):
                p.zero_()
            elif "layernorm" in name or "layer_norm" in name:
                p.fill_(1)
            else:
                g = torch.Generator().manual_seed(parameter_seed(seed, name))
                p.normal_(0, config.initializer_range, generator=g)


# --- the model: HF's GPTNeoXForCausalLM module tree and parameter names -------------------------
def rotary_tables(seq_len, dim, base):
    """cos, sin (seq_len, dim) fp32: inv_freq = 1 / base^(arange(0, dim, 2) / dim), cat(f, f)."""
    inv_freq = 1.0 / torch.pow(base, torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    freqs = torch.outer(torch.arange(seq_len, dtype=torch.float32), inv_freq)
    emb = torch.cat([freqs, freqs], -1)
    return emb.cos(), emb.sin()


def rotate_half(x):
    half = x.size(-1) // 2
    return torch.cat([-x[..., half:], x[..., :half]], -1)


def apply_rotary(x, cos, sin, dim):
    rot, rest = x[..., :dim], x[..., dim:]
    return torch.cat([rot * cos + rotate_half(rot) * sin, rest], -1)


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.num_heads, self.head_size = c.num_attention_heads, c.head_size
        self.rotary_ndims, self.rotary_base = c.rotary_ndims, c.rotary_emb_base
        self.query_key_value = nn.Linear(c.hidden_size, 3 * c.hidden_size)
        self.dense = nn.Linear(c.hidden_size, c.hidden_size)

    def forward(self, x):  # (B, T, hidden)
        b, t, hs = x.size(0), x.size(1), self.head_size
        qkv = self.query_key_value(x).view(b, t, self.num_heads, 3 * hs)
        q = qkv[..., :hs].permute(0, 2, 1, 3)  # (B, heads, T, head_size)
        k = qkv[..., hs:2 * hs].permute(0, 2, 1, 3)
        v = qkv[..., 2 * hs:].permute(0, 2, 1, 3)
        if self.rotary_ndims > 0:
            cos, sin = rotary_tables(t, self.rotary_ndims, self.rotary_base)
            cos, sin = cos.to(q.dtype), sin.to(q.dtype)
            q = apply_rotary(q, cos, sin, self.rotary_ndims)
            k = apply_rotary(k, cos, sin, self.rotary_ndims)
        # Scores and softmax in fp32, as HF upcasts; under CPU autocast matmul computes in bf16
        # whatever its inputs, so the mask value is the scores' own dtype's lowest (as HF does).
        scores = torch.matmul(q.float(), k.float().transpose(-1, -2)).mul_(1.0 / math.sqrt(hs))
        future = torch.ones(t, t, dtype=torch.bool).triu(1)
        scores.masked_fill_(future, torch.finfo(scores.dtype).min)
        probs = torch.softmax(scores, -1).to(v.dtype)
        out = torch.matmul(probs, v).permute(0, 2, 1, 3).reshape(b, t, self.num_heads * hs)
        return self.dense(out)


class Mlp(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.dense_h_to_4h = nn.Linear(c.hidden_size, c.intermediate_size)
        self.dense_4h_to_h = nn.Linear(c.intermediate_size, c.hidden_size)

    def forward(self, x):
        return self.dense_4h_to_h(F.gelu(self.dense_h_to_4h(x)))


class Layer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.parallel = c.use_parallel_residual
        self.input_layernorm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)
        self.post_attention_layernorm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)
        self.attention = Attention(c)
        self.mlp = Mlp(c)

    def forward(self, x):
        attn_out = self.attention(self.input_layernorm(x))
        if self.parallel:
            return self.mlp(self.post_attention_layernorm(x)) + attn_out + x  # HF's order
        attn_out = attn_out + x
        return self.mlp(self.post_attention_layernorm(attn_out)) + attn_out


class GptNeoXModel(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embed_in = nn.Embedding(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList(Layer(c) for _ in range(c.num_hidden_layers))
        self.final_layer_norm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)

    def forward(self, ids):  # (B, T) int64 -> (B, T, hidden)
        x = self.embed_in(ids)
        for layer in self.layers:
            x = layer(x)
        return self.final_layer_norm(x)


class GptNeoX(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.gpt_neox = GptNeoXModel(c)
        self.embed_out = nn.Linear(c.hidden_size, c.vocab_size, bias=False)

    def forward(self, ids):  # (B, T) -> (B, T, vocab) logits
        return self.embed_out(self.gpt_neox(ids))


# --- the job: peer_driver.py -------------------------------------------------------------------
def main():
    peer_driver.run(program="gpt_neox_ddp.py", description=__doc__.split("\n\n")[0], presets=PRESETS,
                    common=COMMON, default_preset="pythia-14m", config_class=Config,
                    model_class=GptNeoX, init_parameters=init_parameters)


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        sys.exit(130)
