#!/usr/bin/env python3
"""Writes the malformed weight-file corpus to tests/data/malformed/ (python3 standard library only).

Every file here must make `easel inspect FILE` exit 1 with one "error: ..." line, and
WeightIndex::open throw easel::Error (tests/cli/inspect_malformed.sh, tests/unit/io_malformed_test.cpp).
Run: python3 tools/make-malformed/make.py [output folder]
"""
import json
import os
import struct
import sys

OUT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "..", "tests", "data", "malformed")


def write(name, data):
    with open(os.path.join(OUT, name), "wb") as f:
        f.write(data)


# ---------------------------------------------------------------- safetensors
def st(header, data=b"", pad=True, raw_header=None):
    h = raw_header if raw_header is not None else json.dumps(header).encode()
    if pad:
        h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + data


def f32(*v):
    return struct.pack("<%df" % len(v), *v)


def ok_entry(off=0, n=2, dtype="F32", shape=None):
    return {"dtype": dtype, "shape": shape if shape is not None else [n], "data_offsets": [off, off + 4 * n]}


def safetensors_cases():
    write("st_empty.safetensors", b"")
    write("st_short.safetensors", b"\x10\x00\x00")
    write("st_header_past_eof.safetensors", struct.pack("<Q", 1000) + b'{"a": 1}')
    write("st_header_len_huge.safetensors", struct.pack("<Q", 2**64 - 1) + b"{}")
    write("st_header_len_over_limit.safetensors", struct.pack("<Q", 200_000_000) + b"{" + b" " * 64)
    write("st_not_json.safetensors", st(None, raw_header=b"{this is not json}"))
    write("st_header_array.safetensors", st(None, raw_header=b"[1, 2, 3]"))
    write("st_truncated_json.safetensors", st(None, raw_header=b'{"a": {"dtype": "F32", "sha', pad=False))
    write("st_truncated_data.safetensors", st({"a": ok_entry(0, 4)}, f32(1, 2)))
    write("st_offsets_reversed.safetensors", st({"a": {"dtype": "F32", "shape": [2], "data_offsets": [8, 0]}}, f32(1, 2)))
    write("st_offsets_overlap.safetensors", st({"a": ok_entry(0, 2), "b": ok_entry(4, 2)}, f32(1, 2, 3, 4)))
    write("st_offsets_past_end.safetensors", st({"a": {"dtype": "F32", "shape": [2], "data_offsets": [2**63, 2**63 + 8]}}, f32(1, 2)))
    write("st_offsets_not_pair.safetensors", st({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0]}}, f32(1, 2)))
    write("st_offsets_negative.safetensors", st({"a": {"dtype": "F32", "shape": [2], "data_offsets": [-8, 0]}}, f32(1, 2)))
    write("st_unknown_dtype.safetensors", st({"a": {"dtype": "F4", "shape": [2], "data_offsets": [0, 1]}}, b"\x00"))
    write("st_dtype_not_string.safetensors", st({"a": {"dtype": 7, "shape": [2], "data_offsets": [0, 8]}}, f32(1, 2)))
    write("st_shape_bytes_mismatch.safetensors", st({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, f32(1, 2)))
    write("st_shape_negative.safetensors", st({"a": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}}, f32(1, 2)))
    write("st_shape_float.safetensors", st({"a": {"dtype": "F32", "shape": [2.0], "data_offsets": [0, 8]}}, f32(1, 2)))
    write("st_shape_overflow.safetensors",
          st({"a": {"dtype": "F32", "shape": [2**32, 2**32, 16], "data_offsets": [0, 8]}}, f32(1, 2)))
    write("st_shape_too_many_dims.safetensors", st({"a": {"dtype": "U8", "shape": [1] * 40, "data_offsets": [0, 1]}}, b"\x00"))
    write("st_missing_fields.safetensors", st({"a": {"dtype": "F32", "shape": [2]}}, f32(1, 2)))
    write("st_entry_not_object.safetensors", st({"a": [1, 2]}, f32(1, 2)))
    write("st_metadata_not_object.safetensors", st({"__metadata__": "x", "a": ok_entry()}, f32(1, 2)))
    write("st_empty_name.safetensors", st({"": ok_entry()}, f32(1, 2)))
    dup = b'{"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, "a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}'
    write("st_duplicate_key.safetensors", st(None, f32(1, 2), raw_header=dup))
    write("st_deep_nesting.safetensors", st(None, raw_header=b'{"a": ' + b"[" * 10000 + b"]" * 10000 + b"}"))
    write("st_deep_metadata.safetensors", st(None, raw_header=b'{"__metadata__": ' + b'{"k": ' * 40 + b"1" + b"}" * 41))
    bad_utf8 = b'{"w\xff\xfe": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}'
    write("st_non_utf8_name.safetensors", st(None, f32(1), raw_header=bad_utf8))
    write("st_no_brace.safetensors", struct.pack("<Q", 4) + b"abcd")


# ---------------------------------------------------------------- GGUF
GGUF_U8, GGUF_I8, GGUF_U16, GGUF_I16, GGUF_U32, GGUF_I32, GGUF_F32, GGUF_BOOL, GGUF_STR, GGUF_ARR, GGUF_U64, GGUF_I64, GGUF_F64 = range(13)
T_F32, T_F16, T_Q8_0 = 0, 1, 8


def gstr(s):
    if isinstance(s, str):
        s = s.encode()
    return struct.pack("<Q", len(s)) + s


def kv_str(k, v):
    return gstr(k) + struct.pack("<i", GGUF_STR) + gstr(v)


def kv_u32(k, v):
    return gstr(k) + struct.pack("<iI", GGUF_U32, v)


def tinfo(name, ne, ttype, off):
    return gstr(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<q", n) for n in ne) + struct.pack("<iQ", ttype, off)


def gguf(kvs=(), tensors=(), data=b"", n_tensors=None, n_kv=None, version=3, magic=b"GGUF", align=32):
    h = magic + struct.pack("<I", version)
    h += struct.pack("<q", len(tensors) if n_tensors is None else n_tensors)
    h += struct.pack("<q", len(kvs) if n_kv is None else n_kv)
    h += b"".join(kvs) + b"".join(tensors)
    if tensors:
        h += b"\x00" * (-len(h) % align)
    return h + data


def gguf_cases():
    good_t = [tinfo("w", [4], T_F32, 0)]
    good_d = f32(1, 2, 3, 4)
    write("gguf_wrong_magic.gguf", gguf(good_d and [kv_str("a", "b")], good_t, good_d, magic=b"GGUX"))
    write("gguf_magic_only.gguf", b"GGUF")
    write("gguf_truncated_header.gguf", gguf()[:18])
    write("gguf_version_0.gguf", gguf(version=0))
    write("gguf_version_1.gguf", gguf(version=1))
    write("gguf_version_big_endian.gguf", gguf(version=0x03000000))
    write("gguf_version_future.gguf", gguf(version=99))
    write("gguf_absurd_tensor_count.gguf", gguf(n_tensors=2**62))
    write("gguf_negative_tensor_count.gguf", gguf(n_tensors=-1))
    write("gguf_absurd_kv_count.gguf", gguf([kv_str("a", "b")], n_kv=2**61))
    write("gguf_huge_string.gguf", gguf([gstr("k") + struct.pack("<iQ", GGUF_STR, 2**60) + b"abc"]))
    write("gguf_huge_key.gguf", gguf([struct.pack("<Q", 2**63 + 5) + b"k"]))
    write("gguf_huge_array.gguf", gguf([gstr("k") + struct.pack("<iiQ", GGUF_ARR, GGUF_U32, 2**40) + b"\x00" * 16]))
    write("gguf_huge_string_array.gguf", gguf([gstr("k") + struct.pack("<iiQ", GGUF_ARR, GGUF_STR, 2**30) + gstr("x")]))
    write("gguf_nested_array.gguf", gguf([gstr("k") + struct.pack("<iiQ", GGUF_ARR, GGUF_ARR, 1) + b"\x00" * 16]))
    write("gguf_bad_kv_type.gguf", gguf([gstr("k") + struct.pack("<iI", 77, 0)]))
    write("gguf_empty_key.gguf", gguf([kv_str("", "v")]))
    write("gguf_duplicate_key.gguf", gguf([kv_str("a", "1"), kv_str("a", "2")]))
    write("gguf_alignment_not_pow2.gguf", gguf([kv_u32("general.alignment", 3)], good_t, good_d, align=3))
    write("gguf_alignment_zero.gguf", gguf([kv_u32("general.alignment", 0)], good_t, good_d))
    write("gguf_alignment_wrong_type.gguf", gguf([kv_str("general.alignment", "32")], good_t, good_d))
    write("gguf_bad_tensor_type.gguf", gguf([], [tinfo("w", [4], 200, 0)], good_d))
    write("gguf_removed_tensor_type.gguf", gguf([], [tinfo("w", [32], 4, 0)], b"\x00" * 64))
    write("gguf_too_many_dims.gguf", gguf([], [tinfo("w", [1, 1, 1, 1, 4], T_F32, 0)], good_d))
    write("gguf_negative_dim.gguf", gguf([], [tinfo("w", [-4], T_F32, 0)], good_d))
    write("gguf_absurd_dims.gguf", gguf([], [tinfo("w", [2**40, 2**40], T_F32, 0)], good_d))
    write("gguf_block_mismatch.gguf", gguf([], [tinfo("w", [33], T_Q8_0, 0)], b"\x00" * 64))
    write("gguf_data_past_eof.gguf", gguf([], [tinfo("w", [1024], T_F32, 0)], good_d))
    write("gguf_offset_past_eof.gguf", gguf([], [tinfo("w", [4], T_F32, 2**50)], good_d))
    write("gguf_offset_gap.gguf", gguf([], [tinfo("w", [4], T_F32, 32)], good_d + good_d + good_d))
    two = [tinfo("w", [8], T_F32, 0), tinfo("v", [8], T_F32, 0)]
    write("gguf_offsets_overlap.gguf", gguf([], two, f32(*range(16))))
    dup = [tinfo("w", [4], T_F32, 0), tinfo("w", [4], T_F32, 32)]
    write("gguf_duplicate_tensor.gguf", gguf([], dup, good_d + b"\x00" * 16 + good_d))
    write("gguf_name_too_long.gguf", gguf([], [tinfo("w" * 300, [4], T_F32, 0)], good_d))
    write("gguf_truncated_tensor_info.gguf", gguf([], good_t)[:-6])


def other_cases():
    write("other_garbage.dat", bytes(range(256)) * 4)
    write("other_text.safetensors", b"hello world, this is not a weight file\n")
    write("other_index_no_weight_map.safetensors.index.json", b'{"metadata": {}}')
    write("other_index_missing_shard.safetensors.index.json", b'{"weight_map": {"a": "missing-00001-of-00001.safetensors"}}')
    write("other_index_escape.safetensors.index.json", b'{"weight_map": {"a": "../../etc/passwd"}}')
    write("other_index_not_json.safetensors.index.json", b"{weight_map")


if __name__ == "__main__":
    os.makedirs(OUT, exist_ok=True)
    for f in os.listdir(OUT):
        os.remove(os.path.join(OUT, f))
    safetensors_cases()
    gguf_cases()
    other_cases()
    print(f"wrote {len(os.listdir(OUT))} files to {os.path.normpath(OUT)}")
