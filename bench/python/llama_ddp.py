#!/opt/trainyard/venv/bin/python
"""The Python PyTorch peer of examples/train_gpt_fsdp.cpp --strategy ddp for Llama presets.

An independent Llama in plain torch, computed as Hugging Face's LlamaForCausalLM computes it:
pre-norm decoder layers, RMSNorm in fp32 cast back to the input's dtype then times its weight,
SwiGLU MLP down_proj(silu(gate_proj(x)) * up_proj(x)), rotate-half rotary embeddings over the whole
head with rope_theta (and the "llama3" frequency scaling of llama-3.2-1b), grouped-query attention
by repeating each key/value head for the query heads it serves, and lm_head tied to
model.embed_tokens where the preset says so. HF's module tree and parameter names
(model.embed_tokens.weight, model.layers.N.self_attn.{q,k,v,o}_proj.weight,
model.layers.N.mlp.{gate,up,down}_proj.weight,
model.layers.N.{input,post_attention}_layernorm.weight, model.norm.weight, lm_head.weight when
untied), the presets of src/models/llama_config.cpp.
Attention is plain matmul + causal mask + softmax with the scores and softmax in fp32, as the C++
model (layers.cpp causal_attention) computes them; the rotary cos/sin tables are cast to the
queries' dtype as the C++ model does (HF casts them to the residual stream's dtype, fp32 under
autocast: in fp32 the two are identical, in bf16 only rounding differs).

The same initial weights as trainyard (each parameter drawn from its own generator seeded from
(seed, name), as Note [Per-name initialisation] does: linear and embedding weights
normal(0, 0.02), RMSNorm weights 1, biases 0, of which these presets have none), the same data
(step s trains on the global windows [s * W * B, (s + 1) * W * B) of the file's bytes, rank r on
its B of them), AdamW(lr, eps 1e-8, torch's other defaults, which LibTorch's AdamWOptions
shares), torch.nn.parallel.DistributedDataParallel over Gloo with its defaults, 1 intra-op thread
per rank. In fp32 its losses equal the C++ example's up to summation order.

--precision bf16-mixed runs forward and loss under torch.autocast(device_type="cpu",
dtype=torch.bfloat16); parameters, gradients and AdamW stay fp32.

It prints what the C++ example prints, so one parser (bench/gpt_fsdp.sh) reads both:
  step N loss X                       (rank 0; X = the mean loss over all ranks' tokens)
  rank R: T tokens/s, peak RSS M MiB, model state S MiB (python-ddp, PRECISION)
tokens/s = steps * B * seq_len * W / this rank's seconds over all steps (the first included),
model state = 16 bytes (fp32 parameter, gradient, two AdamW moments) x parameters.
--phase-times adds, on rank 0, the mean forward / backward / optimizer time of steps 1.. .
For bench/gpt_fsdp.sh it exposes what bench/python/gpt_neox_ddp.py does: PRESETS, COMMON and
Config(**PRESETS[name], **COMMON).parameter_count().

Run it with Debian's interpreter (python3-torch 1.13), launching the ranks with trainyard:

  build/trainyard run --nproc-per-node 2 -- /opt/trainyard/venv/bin/python bench/python/llama_ddp.py \
      --preset smollm2-135m --seq-len 256 --batch-size 4 --steps 10 \
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



# Hugging Face LlamaConfig fields, as LlamaConfig::preset builds them (src/models/llama_config.cpp):
# the struct's defaults (Llama 2 7B's sizes, rms_norm_eps 1e-6, rope_theta 10000) overridden per
# preset. rope_scaling is None or HF's dict.
def llama(**fields):
    config = dict(vocab_size=32000, hidden_size=4096, intermediate_size=11008,
                  num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=32,
                  head_dim=None, max_position_embeddings=2048, rms_norm_eps=1e-6,
                  rope_theta=10000.0, rope_scaling=None, tie_word_embeddings=False)
    config.update(fields)
    return config


LLAMA3_SCALING = dict(rope_type="llama3", factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0,
                      original_max_position_embeddings=8192)
PRESETS = {
    "llama-2-7b": llama(max_position_embeddings=4096, rms_norm_eps=1e-5),
    "llama-2-13b": llama(hidden_size=5120, intermediate_size=13824, num_hidden_layers=40,
                         num_attention_heads=40, num_key_value_heads=40,
                         max_position_embeddings=4096, rms_norm_eps=1e-5),
    "llama-2-70b": llama(hidden_size=8192, intermediate_size=28672, num_hidden_layers=80,
                         num_attention_heads=64, num_key_value_heads=8,
                         max_position_embeddings=4096, rms_norm_eps=1e-5),
    "llama-3-8b": llama(vocab_size=128256, intermediate_size=14336, num_key_value_heads=8,
                        max_position_embeddings=8192, rms_norm_eps=1e-5, rope_theta=500000.0),
    "llama-3.2-1b": llama(vocab_size=128256, hidden_size=2048, intermediate_size=8192,
                          num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
                          head_dim=64, max_position_embeddings=131072, rms_norm_eps=1e-5,
                          rope_theta=500000.0, rope_scaling=LLAMA3_SCALING,
                          tie_word_embeddings=True),
    "tinyllama-1.1b": llama(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22,
                            num_attention_heads=32, num_key_value_heads=4,
                            max_position_embeddings=2048, rms_norm_eps=1e-5),
    "smollm2-135m": llama(vocab_size=49152, hidden_size=576, intermediate_size=1536,
                          num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                          max_position_embeddings=8192, rms_norm_eps=1e-5, rope_theta=100000.0,
                          tie_word_embeddings=True),
    # For tests: 4 query heads sharing 2 key/value heads of 8 dimensions; bytes as tokens.
    "llama-tiny": llama(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                        rms_norm_eps=1e-5),
}
COMMON = dict(initializer_range=0.02)  # no preset sets it


class Config:
    def __init__(self, **fields):
        self.__dict__.update(fields)
        self.head_size = self.head_dim or self.hidden_size // self.num_attention_heads

    def parameter_count(self):
        h, v, i = self.hidden_size, self.vocab_size, self.intermediate_size
        q = self.num_attention_heads * self.head_size
        kv = self.num_key_value_heads * self.head_size
        layer = 2 * h + (h * q + 2 * h * kv + q * h) + 3 * h * i  # norms, attention, MLP
        head = 0 if self.tie_word_embeddings else v * h  # lm_head
        return v * h + self.num_hidden_layers * layer + h + head


# --- Note [Per-name initialisation], as src/models/layers.cpp computes it -----------------------
def init_parameters(model, config, seed):
    """Linear and Embedding weights ~ normal(0, initializer_range) from a CPU generator seeded per
    name (mt19937, as at::make_generator<CPUGeneratorImpl>(seed)), biases 0, RMSNorm weights 1."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".bias"):
                p.zero_()
            elif name.endswith("layernorm.weight") or name == "model.norm.weight":
                p.fill_(1)
            else:
                g = torch.Generator().manual_seed(parameter_seed(seed, name))
                p.normal_(0, config.initializer_range, generator=g)


# --- the model: HF's LlamaForCausalLM module tree and parameter names ---------------------------
def inv_frequencies(c):
    """(head_size / 2) fp32: 1 / theta^(2j / head_size), scaled as HF's _compute_llama3_parameters
    does for rope_type llama3 (by wavelength against original_max_position_embeddings)."""
    d = c.head_size
    inv_freq = 1.0 / (c.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    s = c.rope_scaling
    if s is None:
        return inv_freq
    assert s["rope_type"] == "llama3", s
    old_len = s["original_max_position_embeddings"]
    low, high, factor = s["low_freq_factor"], s["high_freq_factor"], s["factor"]
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < old_len / high) & ~(wavelen > old_len / low)
    return torch.where(medium, smoothed, scaled)


def rotate_half(x):
    half = x.size(-1) // 2
    return torch.cat([-x[..., half:], x[..., :half]], -1)


class RMSNorm(nn.Module):
    def __init__(self, size, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x):
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * normed.to(x.dtype)


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.heads, self.kv_heads = c.num_attention_heads, c.num_key_value_heads
        self.head_size = c.head_size
        h, q, kv = c.hidden_size, self.heads * self.head_size, self.kv_heads * self.head_size
        self.q_proj = nn.Linear(h, q, bias=False)
        self.k_proj = nn.Linear(h, kv, bias=False)
        self.v_proj = nn.Linear(h, kv, bias=False)
        self.o_proj = nn.Linear(q, h, bias=False)

    def forward(self, x, cos, sin):  # x (B, T, hidden); cos, sin (T, head_size) fp32
        b, t, hs = x.size(0), x.size(1), self.head_size
        q = self.q_proj(x).view(b, t, self.heads, hs).transpose(1, 2)  # (B, heads, T, hs)
        k = self.k_proj(x).view(b, t, self.kv_heads, hs).transpose(1, 2)  # (B, kv_heads, T, hs)
        v = self.v_proj(x).view(b, t, self.kv_heads, hs).transpose(1, 2)
        cos, sin = cos.to(q.dtype), sin.to(q.dtype)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        groups = self.heads // self.kv_heads  # HF's repeat_kv
        k = k.repeat_interleave(groups, dim=1)
        v = v.repeat_interleave(groups, dim=1)
        # Scores and softmax in fp32; under CPU autocast matmul computes in bf16 whatever its
        # inputs, so the mask value is the scores' own dtype's lowest (as HF does).
        scores = torch.matmul(q.float(), k.float().transpose(-1, -2)).mul_(1.0 / math.sqrt(hs))
        future = torch.ones(t, t, dtype=torch.bool).triu(1)
        scores.masked_fill_(future, torch.finfo(scores.dtype).min)
        probs = torch.softmax(scores, -1).to(v.dtype)
        out = torch.matmul(probs, v).transpose(1, 2).reshape(b, t, self.heads * hs)
        return self.o_proj(out)


class Mlp(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, c):
        super().__init__()  # HF's registration order, which named_parameters() and DDP follow
        self.self_attn = Attention(c)
        self.mlp = Mlp(c)
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)

    def forward(self, x, cos, sin):
        h = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return h + self.mlp(self.post_attention_layernorm(h))


class LlamaModel(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(c) for _ in range(c.num_hidden_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        # A plain attribute, not a buffer: DDP would broadcast a buffer before every forward.
        self.inv_freq = inv_frequencies(c)

    def forward(self, ids):  # (B, T) int64 -> (B, T, hidden)
        with torch.autocast(device_type="cpu", enabled=False):  # the tables in fp32, as HF
            freqs = torch.outer(torch.arange(ids.size(1), dtype=torch.float32), self.inv_freq)
            emb = torch.cat([freqs, freqs], -1)
            cos, sin = emb.cos(), emb.sin()
        x = self.embed_tokens(ids)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.norm(x)


class Llama(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.config = c
        self.model = LlamaModel(c)
        if not c.tie_word_embeddings:  # tied: no lm_head.weight, as HF's named_parameters() shows
            self.lm_head = nn.Linear(c.hidden_size, c.vocab_size, bias=False)

    def forward(self, ids):  # (B, T) -> (B, T, vocab) logits
        if ids.size(1) > self.config.max_position_embeddings:
            raise ValueError(f"{ids.size(1)} positions; max_position_embeddings is "
                             f"{self.config.max_position_embeddings}")
        hidden = self.model(ids)
        if self.config.tie_word_embeddings:
            return F.linear(hidden, self.model.embed_tokens.weight)
        return self.lm_head(hidden)


# --- the job: peer_driver.py -------------------------------------------------------------------
def main():
    peer_driver.run(program="llama_ddp.py", description=__doc__.split("\n\n")[0], presets=PRESETS,
                    common=COMMON, default_preset="smollm2-135m", config_class=Config,
                    model_class=Llama, init_parameters=init_parameters)


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        sys.exit(130)
