#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets into tests/fuzz/corpus/<target>/ (tests/fuzz/README.md).

Usage (repository root): python3 tests/fuzz/make_corpus.py [--easel build/bin/easel]

Python's standard library only. Each seed is a small, well-formed input of the format (plus the
malformed files of tests/data/malformed for the weight readers), so the fuzzer starts from inputs
that pass the first checks. With --easel, artifacts made by easel itself from the tiny SD
pipeline (tests/data/reference/sd_tiny) are added to the artifact corpus. Re-running rewrites
the generated files; files added by hand (other names) are left alone.
"""
import argparse
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import zlib

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CORPUS = os.path.join(ROOT, "tests", "fuzz", "corpus")
DATA = os.path.join(ROOT, "tests", "data")


def put(target, name, data):
    d = os.path.join(CORPUS, target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode("utf-8")
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def f16_bytes(values):
    return b"".join(struct.pack("<e", v) for v in values)


# ------------------------------------------------------------------------------ safetensors

ST_SIZES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}


def safetensors(tensors, metadata=None):
    """tensors: [(name, dtype, shape)] with deterministic contents."""
    header, blobs, off = {}, [], 0
    if metadata is not None:
        header["__metadata__"] = metadata
    for i, (name, dtype, shape) in enumerate(tensors):
        n = 1
        for s in shape:
            n *= s
        size = n * ST_SIZES[dtype]
        if dtype == "F32":
            b = b"".join(struct.pack("<f", 0.25 * ((k + i) % 7) - 0.5) for k in range(n))
        elif dtype == "F16":
            b = f16_bytes([0.125 * ((k + i) % 9) - 0.5 for k in range(n)])
        else:
            b = bytes(((k * 37 + i) & 0x7F) for k in range(size))
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + size]}
        blobs.append(b)
        off += size
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    return struct.pack("<Q", len(h)) + h + b"".join(blobs)


def safetensors_seeds():
    t = "safetensors"
    put(t, "empty_tensor_list.safetensors", safetensors([], {"format": "pt"}))
    put(t, "dtypes.safetensors", safetensors([(f"t.{d.lower()}", d, [2, 3]) for d in ST_SIZES]))
    put(t, "scalar_and_zero.safetensors", safetensors([("a", "F32", []), ("b", "F32", [0, 4]), ("c", "F16", [5])]))
    # names detect() looks at: an SD1.x UNet, a CLIP text encoder, a VAE, a LoRA, an embedding
    put(t, "sd_unet_keys.safetensors", safetensors([
        ("model.diffusion_model.input_blocks.0.0.weight", "F16", [4, 4, 3, 3]),
        ("model.diffusion_model.input_blocks.0.0.bias", "F16", [4]),
        ("model.diffusion_model.time_embed.0.weight", "F32", [8, 4]),
        ("model.diffusion_model.out.2.weight", "F16", [4, 4, 3, 3]),
        ("model.diffusion_model.input_blocks.1.1.transformer_blocks.0.attn2.to_k.weight", "F16", [4, 8])]))
    put(t, "clip_keys.safetensors", safetensors([
        ("text_model.embeddings.token_embedding.weight", "F32", [16, 8]),
        ("text_model.embeddings.position_embedding.weight", "F32", [4, 8]),
        ("text_model.encoder.layers.0.self_attn.q_proj.weight", "F16", [8, 8]),
        ("text_model.final_layer_norm.weight", "F32", [8])], {"format": "pt"}))
    put(t, "vae_keys.safetensors", safetensors([
        ("encoder.conv_in.weight", "BF16", [4, 3, 3, 3]), ("decoder.conv_out.weight", "BF16", [3, 4, 3, 3]),
        ("quant_conv.weight", "F32", [8, 8, 1, 1]), ("post_quant_conv.weight", "F32", [4, 4, 1, 1])]))
    put(t, "lora_keys.safetensors", safetensors([
        ("lora_unet_down_blocks_0_attentions_0_proj_in.lora_down.weight", "F16", [2, 8]),
        ("lora_unet_down_blocks_0_attentions_0_proj_in.lora_up.weight", "F16", [8, 2]),
        ("lora_unet_down_blocks_0_attentions_0_proj_in.alpha", "F32", [])], {"ss_network_dim": "2"}))
    put(t, "embedding.safetensors", safetensors([("emb_params", "F32", [2, 8])]))
    for f in sorted(os.listdir(os.path.join(DATA, "malformed"))):
        if not f.endswith(".gguf"):
            shutil.copy(os.path.join(DATA, "malformed", f), os.path.join(CORPUS, t, "malformed_" + f))


# ------------------------------------------------------------------------------ GGUF

GGUF_U32, GGUF_F32, GGUF_BOOL, GGUF_STRING, GGUF_ARRAY, GGUF_U64, GGUF_I32 = 4, 6, 7, 8, 9, 10, 5
GGML_F32, GGML_F16, GGML_Q4_0, GGML_Q8_0, GGML_BF16 = 0, 1, 2, 8, 30


def gstr(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def gguf(kvs, tensors, alignment=32):
    """kvs: [(key, type, value)]; tensors: [(name, ggml_type, dims ggml order (ne), data bytes)]."""
    out = b"GGUF" + struct.pack("<I", 3) + struct.pack("<QQ", len(tensors), len(kvs))
    for k, ty, v in kvs:
        out += gstr(k) + struct.pack("<I", ty)
        if ty == GGUF_U32:
            out += struct.pack("<I", v)
        elif ty == GGUF_I32:
            out += struct.pack("<i", v)
        elif ty == GGUF_U64:
            out += struct.pack("<Q", v)
        elif ty == GGUF_F32:
            out += struct.pack("<f", v)
        elif ty == GGUF_BOOL:
            out += struct.pack("<B", 1 if v else 0)
        elif ty == GGUF_STRING:
            out += gstr(v)
        elif ty == GGUF_ARRAY:
            ety, items = v
            out += struct.pack("<IQ", ety, len(items))
            for it in items:
                out += gstr(it) if ety == GGUF_STRING else struct.pack("<i", it)
    off = 0
    datas = []
    for name, ty, ne, data in tensors:
        out += gstr(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", d) for d in ne)
        out += struct.pack("<IQ", ty, off)
        pad = (-len(data)) % alignment
        datas.append(data + b"\0" * pad)
        off += len(data) + pad
    out += b"\0" * ((-len(out)) % alignment)
    return out + b"".join(datas)


def q8_0(n):
    blocks = []
    for b in range(n // 32):
        blocks.append(f16_bytes([0.01 * (b + 1)]) + bytes(((k * 5 + b) % 256) for k in range(32)))
    return b"".join(blocks)


def q4_0(n):
    return b"".join(f16_bytes([0.02 * (b + 1)]) + bytes(((k * 3 + b) % 256) for k in range(16)) for b in range(n // 32))


def gguf_seeds():
    t = "gguf"
    f32 = lambda n: b"".join(struct.pack("<f", 0.1 * (k % 11)) for k in range(n))
    put(t, "empty.gguf", gguf([], []))
    put(t, "kv_types.gguf", gguf([("general.architecture", GGUF_STRING, "stable-diffusion"), ("general.alignment", GGUF_U32, 32),
                                  ("a.u64", GGUF_U64, 7), ("a.f32", GGUF_F32, 0.5), ("a.bool", GGUF_BOOL, True),
                                  ("a.i32", GGUF_I32, -3), ("a.strings", GGUF_ARRAY, (GGUF_STRING, ["x", "yz"])),
                                  ("a.ints", GGUF_ARRAY, (GGUF_I32, [1, 2, 3]))], []))
    put(t, "tensor_types.gguf", gguf([("general.alignment", GGUF_U32, 32)], [
        ("t.f32", GGML_F32, [4, 2], f32(8)), ("t.f16", GGML_F16, [8], f16_bytes([0.5] * 8)),
        ("t.bf16", GGML_BF16, [4], b"\x00\x3f" * 4), ("t.q8_0", GGML_Q8_0, [32, 2], q8_0(64)),
        ("t.q4_0", GGML_Q4_0, [64], q4_0(64))]))
    put(t, "sd_unet_keys.gguf", gguf([("general.architecture", GGUF_STRING, "stable-diffusion")], [
        ("model.diffusion_model.input_blocks.0.0.weight", GGML_F16, [3, 3, 4, 4], f16_bytes([0.25] * 144)),
        ("model.diffusion_model.time_embed.0.weight", GGML_Q8_0, [32, 4], q8_0(128)),
        ("model.diffusion_model.out.2.weight", GGML_F32, [3, 3, 4, 4], f32(144))]))
    put(t, "t5_keys.gguf", gguf([("general.architecture", GGUF_STRING, "t5encoder")], [
        ("enc.blk.0.attn_q.weight", GGML_Q4_0, [32, 2], q4_0(64)), ("token_embd.weight", GGML_F32, [8, 4], f32(32))]))
    for f in sorted(os.listdir(os.path.join(DATA, "malformed"))):
        if f.endswith(".gguf"):
            shutil.copy(os.path.join(DATA, "malformed", f), os.path.join(CORPUS, t, "malformed_" + f))


# ------------------------------------------------------------------------------ artifacts

def structured_artifact(mode, tensors, meta):
    """fuzz_artifact's odd-mode input: kind in the mode byte, then the tensors and metadata."""
    b = bytes([mode, len(tensors)])
    for name, state, dtype, shape, data in tensors:
        nb = name.encode()
        b += bytes([len(nb)]) + nb + bytes([1 if state else 0, dtype, len(shape)]) + bytes(shape) + data
    b += bytes([len(meta)])
    for k, v in meta:
        b += bytes([len(k)]) + k.encode() + bytes([len(v)]) + v.encode()
    return b


def artifact_seeds(easel):
    t = "artifact"
    F32, I64, U8 = 0, 1, 3
    f32 = lambda *v: b"".join(struct.pack("<f", x) for x in v)
    i64 = lambda *v: b"".join(struct.pack("<q", x) for x in v)
    # a complete euler sampler state (sampling/sampler.h SamplerState::to_map keys)
    state = [("sampler", True, U8, [5], b"euler"), ("flow", True, U8, [1], b"\0"), ("shape", True, I64, [4], i64(1, 1, 1, 2)),
             ("x", True, F32, [2], f32(0.5, -1.0)), ("step", True, I64, [1], i64(1)), ("sigmas", True, F32, [3], f32(14.6, 1.0, 0.0)),
             ("timesteps", True, F32, [2], f32(999.0, 500.0)), ("eta", True, F32, [1], f32(0.0)), ("s_noise", True, F32, [1], f32(1.0)),
             ("rng", True, I64, [2], i64(1, 0)), ("old_denoised", True, F32, [0], b""), ("version", True, I64, [1], i64(1))]
    put(t, "structured_checkpoint_euler", structured_artifact(1 + 2 * 2, state, [("params", "{}")]))
    put(t, "structured_latent", structured_artifact(1 + 2 * 1, [("latent", False, F32, [1, 1, 1, 2], f32(0.1, 0.2))], [("model", "SD1.x")]))
    put(t, "structured_conditioning", structured_artifact(1, [("context", False, F32, [1, 2, 2], f32(1, 2, 3, 4))], [("prompt", "a cat")]))
    if not easel:
        return
    sd = os.path.join(DATA, "reference", "sd_tiny", "sd_tiny.safetensors")
    with tempfile.TemporaryDirectory() as d:
        env = dict(os.environ, XDG_CACHE_HOME=os.path.join(d, "cache"))
        run = lambda *a: subprocess.run([easel, *a], check=True, capture_output=True, env=env)
        cond = os.path.join(d, "cond.safetensors")
        run("encode-prompt", "-m", sd, "-t", "1", "-p", "a (cat:1.2)", "-n", "blurry", "--save-embeddings", cond)
        run("denoise", "-m", sd, "-t", "1", "--load-embeddings", cond, "-W", "16", "-H", "16", "--steps", "2", "-s", "1",
            "--sampling-method", "dpm++2m", "--checkpoint-dir", os.path.join(d, "ck"), "--save-latent", os.path.join(d, "lat.safetensors"))
        for name, src in [("easel_conditioning", cond), ("easel_latent", os.path.join(d, "lat.safetensors")),
                          ("easel_checkpoint_dpmpp2m", os.path.join(d, "ck", "image1-step0002.safetensors"))]:
            with open(src, "rb") as f:
                put(t, name, b"\0" + f.read())  # mode 0: the bytes are the file


# ------------------------------------------------------------------------------ images, infotext

def png_chunk(ty, data):
    return struct.pack(">I", len(data)) + ty + data + struct.pack(">I", zlib.crc32(ty + data) & 0xFFFFFFFF)


def png(w, h, color_type, texts=(), after_idat=()):
    channels = {0: 1, 2: 3, 4: 2, 6: 4}[color_type]
    raw = b"".join(b"\0" + bytes(((x * 40 + y * 13 + c * 70) & 0xFF) for x in range(w) for c in range(channels)) for y in range(h))
    out = b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, color_type, 0, 0, 0))
    for kind, key, text in texts:
        if kind == "tEXt":
            out += png_chunk(b"tEXt", key.encode("latin-1") + b"\0" + text.encode("latin-1"))
        elif kind == "zTXt":
            out += png_chunk(b"zTXt", key.encode("latin-1") + b"\0\0" + zlib.compress(text.encode("latin-1")))
        else:
            out += png_chunk(b"iTXt", key.encode("latin-1") + b"\0\0\0\0\0" + text.encode("utf-8"))
    out += png_chunk(b"IDAT", zlib.compress(raw))
    for kind, key, text in after_idat:
        out += png_chunk(b"tEXt", key.encode("latin-1") + b"\0" + text.encode("latin-1"))
    return out + png_chunk(b"IEND", b"")


def bmp(w, h):
    row = (w * 3 + 3) & ~3
    pix = b"".join(bytes(((x * 30 + y * 50) & 0xFF for x in range(w * 3))) + b"\0" * (row - w * 3) for y in range(h))
    return b"BM" + struct.pack("<IHHI", 54 + len(pix), 0, 0, 54) + struct.pack("<IiiHHIIiiII", 40, w, h, 1, 24, 0, len(pix), 0, 0, 0, 0) + pix


INFOTEXTS = [
    "a photo of a cat\nNegative prompt: blurry\nSteps: 20, Sampler: Euler a, Schedule type: Karras, CFG scale: 7, Seed: 1, Size: 512x512, Model: sd15, Version: easel 0.1.0",
    "(masterpiece:1.2), [blurry], <lora:detail:0.8>\nSteps: 4, Sampler: DPM++ 2M, CFG scale: 1, Seed: 42, Size: 64x64, "
    "Lora hashes: \"detail: 0123456789ab\", Denoising strength: 0.75, Clip skip: 2, RNG: CPU",
    "a\nb\nNegative prompt: c\nd\nSteps: 1, Sampler: Euler, CFG scale: 7.5, Seed: 9223372036854775807, Size: 16384x8, "
    "SDCPP: {\"a\": [1, 2, {\"b\": \"c,d\"}]}, Note: \"quoted, with \\\"escapes\\\" and \\n\"",
    "only a prompt, no settings: here",
    "Steps: 20, Sampler: Euler, Seed: 5",
]


def image_seeds():
    t = "png"
    put(t, "rgb_8x8_parameters.png", png(8, 8, 2, [("tEXt", "parameters", INFOTEXTS[0])]))
    put(t, "gray_3x5_ztxt.png", png(3, 5, 0, [("zTXt", "parameters", INFOTEXTS[1])]))
    put(t, "rgba_4x4_itxt.png", png(4, 4, 6, [("iTXt", "parameters", "un chat \u00e9t\u00e9 \u732b\nSteps: 2, Sampler: Euler, Seed: 3")]))
    put(t, "ga_2x2_text_after_idat.png", png(2, 2, 4, after_idat=[("tEXt", "parameters", INFOTEXTS[2].encode("utf-8").decode("latin-1"))]))
    put(t, "rgb_4x3.bmp", bmp(4, 3))
    for f in sorted(os.listdir(os.path.join(DATA, "png"))):
        if f.endswith((".png", ".jpg")) and os.path.getsize(os.path.join(DATA, "png", f)) > 0:
            shutil.copy(os.path.join(DATA, "png", f), os.path.join(CORPUS, t, "data_png_" + f))
    for i, s in enumerate(INFOTEXTS):
        put("infotext", f"infotext_{i}.txt", s)


# ------------------------------------------------------------------------------ prompts, placement

PROMPTS = [
    "a photo of a cat", "(masterpiece:1.2), ((best quality)), [blurry], (dog:0.5) and \\(escaped\\)",
    "a cat BREAK a dog BREAK", "<lora:detail:0.8> a cat <lora:style:1:0.5:dyn=8> <hypernet:x:1> <lyco:y:te=0.2:unet=0.3>",
    "(unclosed [brackets (nested:1.5) ] )) ]] ((", "un chat \u00e9t\u00e9, \u732b, \U0001F431, " + "word, " * 40,
    "(a:1.2.3)", "<lora::>", "",
]


def placement_seed(bits, *flags):
    b = bytes([bits])
    for f in flags:
        e = f.encode()
        b += bytes([len(e)]) + e
    return b


def text_seeds():
    for i, p in enumerate(PROMPTS):
        for opt in (0, 1 | 2 | 64):
            put("prompt", f"prompt_{i}_{opt}", bytes([opt]) + p.encode("utf-8"))
    specs = [
        (0, "cuda0", "", "", "", ""),
        (0, "diffusion=CUDA0&CUDA1,te=cpu,vae=RPC0", "diffusion=cpu", "row", "CUDA0=12,cuda1=-2", "64"),
        (1, "diffusion=cuda0", "diffusion=cpu", "layer", "8.5", "CUDA0=256,512"),
        (2 | 4 | 8, "*=gpu", "default=disk", "", "", ""),
        (16, "auto", "auto", "row", "RPC0=0.002,RPC1=0.002", ""),
        (0, "te=RPC0&RPC1,diffusion=RPC1&CPU&RPC0", "vae=disk,te=cpu", "", "", ""),
    ]
    for i, s in enumerate(specs):
        put("placement_spec", f"spec_{i}", placement_seed(*s))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--easel", help="easel binary: add artifacts it writes to the artifact corpus")
    a = ap.parse_args()
    safetensors_seeds()
    gguf_seeds()
    artifact_seeds(a.easel)
    image_seeds()
    text_seeds()
    for d in sorted(os.listdir(CORPUS)):
        p = os.path.join(CORPUS, d)
        print(f"{d}: {len(os.listdir(p))} seeds, {sum(os.path.getsize(os.path.join(p, f)) for f in os.listdir(p))} bytes")


if __name__ == "__main__":
    sys.exit(main())
