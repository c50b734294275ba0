"""Fixtures for tests/unit/hf_weights_test.cpp, written the way Hugging Face and torch write them.

  hf_fixtures.py make DIR            writes every model directory the test reads, plus expected
                                     values (exp/<name>.{f32,bf16,f16,raw}: what torch converts to)
  hf_fixtures.py check-export DIR REF reads the safetensors export in DIR as the safetensors
                                     format says (not with our code) and compares it with REF

Only Debian's python3-torch 1.13 is used; safetensors files are written and parsed by hand.
"""
import collections
import json
import os
import struct
import sys
import zipfile

import torch

ST_DTYPES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
             torch.float64: "F64", torch.int64: "I64", torch.int32: "I32", torch.uint8: "U8",
             torch.bool: "BOOL", torch.int8: "I8", torch.int16: "I16"}
TORCH_DTYPES = {v: k for k, v in ST_DTYPES.items()}


def raw(t):
    """Little-endian bytes of a contiguous tensor."""
    t = t.contiguous()
    if t.dtype in (torch.bfloat16, torch.float16):
        return t.view(torch.int16).numpy().tobytes()
    return t.numpy().tobytes()


def write_safetensors(path, tensors, metadata=None, edit_header=None):
    """tensors: list of (name, tensor); the bytes follow in list order."""
    header, blobs, offset = {}, [], 0
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, t in tensors:
        b = raw(t)
        header[name] = {"dtype": ST_DTYPES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(b)]}
        blobs.append(b)
        offset += len(b)
    if edit_header:
        edit_header(header)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def write_expected(exp, name, t):
    """What reading tensor `name` as F32/BF16/F16 (or raw, for other dtypes) must give."""
    base = os.path.join(exp, name)
    if t.dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
        for suffix, dt in (("f32", torch.float32), ("bf16", torch.bfloat16), ("f16", torch.float16)):
            with open(f"{base}.{suffix}", "wb") as f:
                f.write(raw(t.to(dt)))
    with open(f"{base}.raw", "wb") as f:
        f.write(raw(t))


def special_values():
    """fp32 values that test rounding: bf16 ties both ways, subnormals, overflow, infinities."""
    bits = [0x3F808000, 0x3F818000, 0x3F80C000, 0x3F807FFF, 0x7F7FFFFF, 0x00000001, 0x80400000,
            0x33800000, 0x477FF000, 0x477FF001, 0xFF800000, 0x7F800000, 0x38800000, 0x387FC000,
            0x00000000, 0x80000000]
    return torch.tensor(bits, dtype=torch.int64).to(torch.int32).view(torch.float32)


def model_tensors():
    g = torch.Generator().manual_seed(7)
    return collections.OrderedDict([
        ("embed.weight", torch.randn(37, 16, generator=g)),
        ("ln.bias", (torch.randn(16, generator=g) * 3).half()),
        ("mlp.weight", torch.randn(24, 16, generator=g).bfloat16()),
        ("special", special_values()),
        ("double", torch.randn(5, generator=g, dtype=torch.float64)),
        ("scalar", torch.tensor(2.5)),
        ("empty", torch.zeros(0, 4)),
        ("steps", torch.tensor([1, -2, 3 << 40])),
        ("mask", torch.tensor([True, False, True])),
    ])


def make(root):
    exp = os.path.join(root, "exp")
    os.makedirs(exp)
    tensors = model_tensors()
    for name, t in tensors.items():
        write_expected(exp, name, t)
    config = {"model_type": "gpt_neox", "hidden_size": 16, "vocab_size": 37}

    def model_dir(name):
        d = os.path.join(root, name)
        os.makedirs(d)
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(config, f)
        return d

    items = list(tensors.items())
    d = model_dir("st")
    write_safetensors(os.path.join(d, "model.safetensors"), items, {"format": "pt"})

    # Sharded as save_pretrained does; the index lists names sorted, not in file order.
    d = model_dir("st_sharded")
    shards = [items[:4], items[4:]]
    weight_map = {}
    for i, shard in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        write_safetensors(os.path.join(d, fname), shard[::-1], {"format": "pt"})
        weight_map.update({n: fname for n, _ in shard})
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": sum(t.numel() * t.element_size() for _, t in items)},
                   "weight_map": dict(sorted(weight_map.items()))}, f, indent=2)

    # pytorch_model.bin: a module's state dict (an OrderedDict with _metadata, Parameters kept),
    # plus fp16 and bf16 tensors and two views into one storage at offsets.
    module = torch.nn.Linear(6, 3)
    with torch.no_grad():
        module.weight.copy_(torch.arange(18, dtype=torch.float32).view(3, 6) / 7)
        module.bias.copy_(torch.tensor([0.5, -1.5, 2.25]))
    sd = module.state_dict(keep_vars=True)  # Parameters: _rebuild_parameter
    base = torch.arange(40, dtype=torch.float32) * 0.25
    sd["shared.a"] = base[3:11]
    sd["shared.b"] = base[20:40].view(4, 5)
    sd["half"] = tensors["ln.bias"]
    sd["bf16"] = tensors["mlp.weight"]
    sd["scalar"] = tensors["scalar"]
    sd["steps"] = tensors["steps"]
    for name, t in sd.items():
        write_expected(exp, "bin." + name, t.detach())
    d = model_dir("bin")
    torch.save(sd, os.path.join(d, "pytorch_model.bin"))

    # The same archive's records repacked as ZIP64 (what torch writes past 4 GiB).
    d = model_dir("bin_zip64")
    repack_zip64(os.path.join(root, "bin", "pytorch_model.bin"), os.path.join(d, "pytorch_model.bin"))

    # Sharded .bin: plain dicts, as save_pretrained's shard_checkpoint makes them.
    d = model_dir("bin_sharded")
    names = list(sd)
    parts = [names[:3], names[3:]]
    weight_map = {}
    for i, part in enumerate(parts):
        fname = f"pytorch_model-{i + 1:05d}-of-{len(parts):05d}.bin"
        torch.save({n: sd[n].detach() for n in part}, os.path.join(d, fname))
        weight_map.update({n: fname for n in part})
    with open(os.path.join(d, "pytorch_model.bin.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": 0}, "weight_map": weight_map}, f)

    make_bad(root, items)


def repack_zip64(src, dst):
    """Writes src's records, stored, with ZIP64 sizes and offsets everywhere they may appear."""
    with zipfile.ZipFile(src) as z:
        records = [(i.filename, z.read(i.filename)) for i in z.infolist()]
    out, central = bytearray(), bytearray()
    for name, data in records:
        n = name.encode()
        crc = zipfile.crc32(data)
        offset = len(out)
        extra = struct.pack("<HHQQ", 1, 16, len(data), len(data))
        out += struct.pack("<IHHHHHIIIHH", 0x04034B50, 45, 0, 0, 0, 0, crc, 0xFFFFFFFF,
                           0xFFFFFFFF, len(n), len(extra)) + n + extra + data
        cextra = struct.pack("<HHQQQ", 1, 24, len(data), len(data), offset)
        central += struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 45, 45, 0, 0, 0, 0, crc,
                               0xFFFFFFFF, 0xFFFFFFFF, len(n), len(cextra), 0, 0, 0, 0,
                               0xFFFFFFFF) + n + cextra
    cd_offset = len(out)
    out += central
    z64 = len(out)
    out += struct.pack("<IQHHIIQQQQ", 0x06064B50, 44, 45, 45, 0, 0, len(records), len(records),
                       len(central), cd_offset)
    out += struct.pack("<IIQI", 0x07064B50, 0, z64, 1)
    out += struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, 0xFFFF, 0xFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0)
    with open(dst, "wb") as f:
        f.write(out)
    with zipfile.ZipFile(dst) as z:  # Python's own reader accepts it
        assert [i.filename for i in z.infolist()] == [r[0] for r in records]
        assert z.read(records[0][0]) == records[0][1]


class Evil:
    def __reduce__(self):
        return (os.system, ("echo this must never run",))


def make_bad(root, items):
    def bad_dir(name):
        d = os.path.join(root, "bad", name)
        os.makedirs(d)
        return d

    good = os.path.join(root, "st", "model.safetensors")
    blob = open(good, "rb").read()
    with open(os.path.join(bad_dir("truncated_st"), "model.safetensors"), "wb") as f:
        f.write(blob[:-10])

    def lying(h):  # "special" claims bytes past the end of the data
        h["special"]["data_offsets"][1] += 4096
        h["special"]["data_offsets"][0] += 4096
    write_safetensors(os.path.join(bad_dir("offsets_past_end_st"), "model.safetensors"), items,
                      edit_header=lying)

    def overlap(h):  # "ln.bias" starts inside "embed.weight"
        b = h["ln.bias"]["data_offsets"]
        h["ln.bias"]["data_offsets"] = [b[0] - 8, b[1] - 8]
    write_safetensors(os.path.join(bad_dir("overlap_st"), "model.safetensors"), items,
                      edit_header=overlap)

    def wrong_size(h):  # the shape says 37 x 16 but the bytes fit 36 x 16
        h["embed.weight"]["shape"] = [36, 16]
    write_safetensors(os.path.join(bad_dir("shape_vs_bytes_st"), "model.safetensors"), items,
                      edit_header=wrong_size)

    with open(os.path.join(bad_dir("header_length_st"), "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", 1 << 40) + blob[8:])

    d = bad_dir("missing_shard")
    write_safetensors(os.path.join(d, "model-00001-of-00002.safetensors"), items[:2])
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": {
            items[0][0]: "model-00001-of-00002.safetensors",
            items[1][0]: "model-00001-of-00002.safetensors",
            items[2][0]: "model-00002-of-00002.safetensors"}}, f)

    d = bad_dir("index_names_absent_tensor")
    write_safetensors(os.path.join(d, "model-00001-of-00001.safetensors"), items[:2])
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": {
            items[0][0]: "model-00001-of-00001.safetensors",
            "ghost.weight": "model-00001-of-00001.safetensors"}}, f)

    torch.save({"w": torch.ones(2), "evil": Evil()},
               os.path.join(bad_dir("global_bin"), "pytorch_model.bin"))
    torch.save({"w": torch.ones(2), "t": torch.arange(6.0).view(2, 3).t()},
               os.path.join(bad_dir("noncontiguous_bin"), "pytorch_model.bin"))
    bin_blob = open(os.path.join(root, "bin", "pytorch_model.bin"), "rb").read()
    with open(os.path.join(bad_dir("truncated_bin"), "pytorch_model.bin"), "wb") as f:
        f.write(bin_blob[: len(bin_blob) // 2])
    bad_dir("empty")


def read_safetensors(path):
    """As the format says: u64 header length, JSON header, data; returns {name: tensor}."""
    blob = open(path, "rb").read()
    (n,) = struct.unpack("<Q", blob[:8])
    assert (8 + n) % 8 == 0, f"{path}: data does not start 8-byte aligned"
    header = json.loads(blob[8:8 + n])
    assert header.get("__metadata__", {}).get("format") == "pt", f"{path}: no format pt"
    data = blob[8 + n:]
    out, ends = {}, []
    for name, v in header.items():
        if name == "__metadata__":
            continue
        b, e = v["data_offsets"]
        dt = TORCH_DTYPES[v["dtype"]]
        t = torch.frombuffer(bytearray(data[b:e]), dtype=dt) if e > b else torch.zeros(0, dtype=dt)
        out[name] = t.reshape(v["shape"])
        ends.append((b, e))
    ends.sort()
    assert ends[0][0] == 0 and all(ends[i][1] == ends[i + 1][0] for i in range(len(ends) - 1))
    assert ends[-1][1] == len(data), f"{path}: data length {len(data)} != {ends[-1][1]}"
    return out


def check_export(directory, ref_dir):
    expected = read_safetensors(os.path.join(ref_dir, "model.safetensors"))
    index = os.path.join(directory, "model.safetensors.index.json")
    got = {}
    if os.path.exists(index):
        idx = json.load(open(index))
        files = sorted(set(idx["weight_map"].values()))
        assert len(files) > 1 and not os.path.exists(os.path.join(directory, "model.safetensors"))
        total = 0
        for fname in files:
            part = read_safetensors(os.path.join(directory, fname))
            for name, t in part.items():
                assert idx["weight_map"][name] == fname, name
                total += t.numel() * t.element_size()
            got.update(part)
        assert idx["metadata"]["total_size"] == total, (idx["metadata"], total)
        print(f"sharded: {len(files)} files")
    else:
        got = read_safetensors(os.path.join(directory, "model.safetensors"))
    assert set(got) == set(expected), (sorted(got), sorted(expected))
    for name, t in expected.items():
        assert got[name].dtype == t.dtype and got[name].shape == t.shape, name
        assert raw(got[name]) == raw(t), f"{name} differs"
    print(f"ok: {len(got)} tensors")


if __name__ == "__main__":
    if sys.argv[1] == "make":
        make(sys.argv[2])
    elif sys.argv[1] == "check-export":
        check_export(sys.argv[2], sys.argv[3])
    else:
        sys.exit(f"unknown command {sys.argv[1]}")
