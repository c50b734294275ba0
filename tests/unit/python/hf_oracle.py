"""Hugging Face's own libraries as the oracle of trainyard's compatibility tests: what transformers
(AutoModelForCausalLM, fp32, eval) computes on a model folder, what PEFT computes with an adapter
on its base, and tiny random folders as transformers' save_pretrained writes them. Offline: the
venv's transformers and peft (scripts/setup.sh), nothing downloaded.

usage:
  hf_oracle.py logits FOLDER IDS_FILE OUT_FILE [FOLDER IDS_FILE OUT_FILE ...] [--rows R]
      the logits for the ids in IDS_FILE (little-endian int64, R rows; R defaults to 2, the rows
      of the reference scripts' ids.i64), written to OUT_FILE as little-endian float32
      (R, T, vocab_size); several folders in one start of Python
  hf_oracle.py greedy FOLDER N ID,ID,... [FOLDER N ID,ID,... ...]
      prints the N ids that model.generate (greedy, its key/value cache) continues ID,ID,...
      with, comma-separated on one line per FOLDER, as `trainyard generate --print-ids` prints
      its new ids; never stops early at an end-of-text id (trainyard stops only at its
      tokenizer's, and the bytes of a folder without tokenizer.json have none)
  hf_oracle.py peft BASE_FOLDER ADAPTER_FOLDER IDS_FILE OUT_FILE [--rows R]
      the logits of peft.PeftModel.from_pretrained(BASE_FOLDER's model, ADAPTER_FOLDER), as
      `logits` writes them
  hf_oracle.py save FOLDER KIND [FOLDER KIND ...]
      a tiny random model of KIND (gpt_neox, llama, mistral, qwen2, qwen3: see KINDS) written by
      save_pretrained as safetensors shards of at most 20 KB with model.safetensors.index.json

A tensor the folder holds that transformers' model does not take, or one the model needs that the
folder lacks, is an error naming them (exit status 1): transformers would drop or initialise it
and compute another model's logits. So is an adapter tensor PEFT did not load as stored.
"""
import os
import sys

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402

transformers.logging.set_verbosity_error()  # the answer goes to stdout; keep stderr for errors
transformers.utils.logging.disable_progress_bar()

# Sizes shared by every KIND: 256 tokens, so that trainyard's byte tokenizer covers the
# vocabulary (bytes train the folder and generate from it without a tokenizer.json).
SMALL = {"vocab_size": 256, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
         "num_attention_heads": 4, "max_position_embeddings": 64}
# What each KIND varies from its architecture's defaults, so that a reader that ignores a field
# transformers writes computes other logits.
KINDS = {
    # rope_parameters {partial_rotary_factor 0.5, rope_theta 5000}: neither is the default.
    "gpt_neox": (transformers.GPTNeoXConfig, {"rotary_pct": 0.5, "rotary_emb_base": 5000}),
    # Grouped-query attention, tied embeddings, llama3 rope_parameters with wavelengths in and
    # above its band.
    "llama": (transformers.LlamaConfig, {
        "num_key_value_heads": 2, "tie_word_embeddings": True,
        "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                            "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                            "original_max_position_embeddings": 16}}),
    # One key/value head of head_dim 16 (not hidden_size / heads); a 4096-token window.
    "mistral": (transformers.MistralConfig, {"num_key_value_heads": 1, "head_dim": 16,
                                             "sliding_window": 4096}),
    # Biased q/k/v, tied embeddings, no sliding window.
    "qwen2": (transformers.Qwen2Config, {"num_key_value_heads": 2, "tie_word_embeddings": True,
                                         "use_sliding_window": False}),
    # Per-head q/k norms with eps 1e-5; head_dim 16 (its default is 128, not hidden_size / heads);
    # biases on all four attention projections; untied.
    "qwen3": (transformers.Qwen3Config, {"num_key_value_heads": 2, "head_dim": 16,
                                         "attention_bias": True, "rms_norm_eps": 1e-5}),
    # 512 tokens: more than a folder without tokenizer.json has bytes for.
    "wide_llama": (transformers.LlamaConfig, {"vocab_size": 512, "num_key_value_heads": 2}),
}


def fail(message):
    print(f"hf_oracle.py: {message}", file=sys.stderr)
    sys.exit(1)


def load(folder):
    """FOLDER's model in fp32, eval; refuses a folder whose tensors the model does not match."""
    model, info = transformers.AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.float32, local_files_only=True, output_loading_info=True)
    wrong = {k: sorted(v) for k, v in info.items() if k != "error_msgs" and v}
    if wrong or info.get("error_msgs"):
        fail(f"transformers' {type(model).__name__} does not load {folder} as stored: "
             f"{wrong} {info.get('error_msgs') or ''}".rstrip())
    return model.eval()


def read_ids(path, rows):
    ids = torch.from_numpy(np.fromfile(path, dtype="<i8"))
    if ids.numel() == 0 or ids.numel() % rows != 0:
        fail(f"{path} holds {ids.numel()} ids, not {rows} rows of equal length.")
    return ids.view(rows, -1)


def write_logits(model, ids, out):
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
    logits.float().numpy().astype("<f4").tofile(out)


def logits_command(args, rows):
    if not args or len(args) % 3 != 0:
        fail("logits takes FOLDER IDS_FILE OUT_FILE, once or more.")
    for folder, ids_file, out in zip(args[0::3], args[1::3], args[2::3]):
        write_logits(load(folder), read_ids(ids_file, rows), out)


def greedy_command(args):
    if not args or len(args) % 3 != 0:
        fail("greedy takes FOLDER N ID,ID,..., once or more.")
    for folder, n, prompt in zip(args[0::3], args[1::3], args[2::3]):
        greedy(folder, int(n), [int(i) for i in prompt.split(",")])


def greedy(folder, n, prompt):
    model = load(folder)
    # generate() fills an eos_token_id left None in the GenerationConfig it is given from the
    # model's (LlamaConfig's default 2 when config.json names none) and stops there; forcing the
    # length with min_new_tokens would mask that id's logit instead, changing the argmax. So the
    # model's own are cleared.
    model.generation_config.eos_token_id = None
    model.config.eos_token_id = None
    ids = torch.tensor([prompt], dtype=torch.int64)
    config = transformers.GenerationConfig(do_sample=False, num_beams=1, max_new_tokens=n,
                                           pad_token_id=0)
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=config)
    print(",".join(str(i) for i in out[0, len(prompt):].tolist()), flush=True)


def peft_command(args, rows):
    if len(args) != 4:
        fail("peft takes BASE_FOLDER ADAPTER_FOLDER IDS_FILE OUT_FILE.")
    import warnings

    import peft
    from safetensors.torch import load_file

    warnings.filterwarnings("ignore", category=FutureWarning)  # transformers' deprecations

    base, adapter, ids_file, out = args
    model = peft.PeftModel.from_pretrained(load(base), adapter, is_trainable=False).eval()
    # Every stored factor in the model as stored ("...q_proj.lora_A.weight" is PEFT's
    # "...q_proj.lora_A.default.weight"), and no adapter of the model left unloaded.
    params = dict(model.named_parameters())
    stored = load_file(os.path.join(adapter, "adapter_model.safetensors"))
    for name, t in stored.items():
        mine = name.replace(".lora_A.weight", ".lora_A.default.weight").replace(
            ".lora_B.weight", ".lora_B.default.weight")
        if mine not in params or not torch.equal(params[mine].detach().float(), t.float()):
            fail(f"PEFT did not load {name} of {adapter} as stored.")
    adapters = [n for n in params if ".lora_" in n]
    if len(adapters) != len(stored):
        fail(f"PEFT built {len(adapters)} adapter tensors from {adapter}, which stores "
             f"{len(stored)}.")
    write_logits(model, read_ids(ids_file, rows), out)


def randomise(model, seed):
    """Weights that give logits of a few units (transformers' initializer_range 0.02 would make
    every logit nearly 0, and a tolerance of 1e-4 on them meaningless): norms 1 + N(0, 0.1),
    biases N(0, 0.1), every other weight N(0, 0.3)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            if "norm" in name and name.endswith(".weight"):
                p.copy_(1 + 0.1 * noise)
            elif name.endswith(".bias"):
                p.copy_(0.1 * noise)
            else:
                p.copy_(0.3 * noise)


def save_command(args):
    if not args or len(args) % 2 != 0:
        fail("save takes FOLDER KIND, once or more.")
    for folder, kind in zip(args[0::2], args[1::2]):
        if kind not in KINDS:
            fail(f"unknown KIND {kind!r}; one of {', '.join(KINDS)}.")
        config_class, overrides = KINDS[kind]
        torch.manual_seed(0)
        model = transformers.AutoModelForCausalLM.from_config(
            config_class(**{**SMALL, **overrides}), dtype=torch.float32)
        randomise(model, seed=sorted(KINDS).index(kind) + 11)
        model.save_pretrained(folder, max_shard_size="20KB")
        if not os.path.exists(os.path.join(folder, "model.safetensors.index.json")):
            fail(f"save_pretrained wrote {folder} unsharded.")


def main(argv):
    rows = 2
    if "--rows" in argv:
        i = argv.index("--rows")
        rows = int(argv[i + 1])
        argv = argv[:i] + argv[i + 2:]
    if not argv:
        fail(__doc__)
    mode, args = argv[0], argv[1:]
    if mode == "logits":
        logits_command(args, rows)
    elif mode == "greedy":
        greedy_command(args)
    elif mode == "peft":
        peft_command(args, rows)
    elif mode == "save":
        save_command(args)
    else:
        fail(f"unknown mode {mode!r}; one of logits, greedy, peft, save.")


if __name__ == "__main__":
    main(sys.argv[1:])
