#!/usr/bin/env python3
"""Writes PyTorch checkpoint test files without torch (python3 standard library only).

torch.save is Python's pickle (protocol 2 by default) with storages as persistent ids, inside a
zip archive (PyTorch >= 1.6) or followed by the raw storages (the legacy format). This script
pickles look-alike objects with CPython's own pickler: fake `torch`, `torch._utils`,
`collections`-using state dicts, `numpy` scalars and a Lightning `ModelCheckpoint`, registered
under the names torch uses, so the bytes are what torch.save writes for the same content (the
opcodes, the memo, the persistent ids). tools/reference/make_pth_fixtures.py makes the same kind
of files with real torch on the GPU machine.

Outputs (run from anywhere; folders default to the repository's):
  tests/data/pytorch/*.pth|.pt|.ckpt|.bin   valid files + expected.json (every tensor's values)
  tests/data/malformed/pt_*                  hostile / damaged files that must be refused
  tests/fuzz/corpus/pytorch/                 seeds for tests/fuzz/fuzz_pytorch and fuzz_pickle
Run: python3 tools/make-malformed/pytorch_files.py [repository root]
"""
import collections
import io
import json
import os
import pickle
import struct
import sys
import types
import zlib

ROOT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
VALID = os.path.join(ROOT, "tests", "data", "pytorch")
MALFORMED = os.path.join(ROOT, "tests", "data", "malformed")
SEEDS = os.path.join(ROOT, "tests", "fuzz", "corpus", "pytorch")


# ---------------------------------------------------------------- look-alike torch objects
def _module(name):
    """A stand-in module (and its parent packages) in sys.modules, so that pickle's import works."""
    parts = name.split(".")
    for i in range(1, len(parts) + 1):
        sub = ".".join(parts[:i])
        if sub not in sys.modules:
            sys.modules[sub] = types.ModuleType(sub)
            if i > 1:
                setattr(sys.modules[".".join(parts[:i - 1])], parts[i - 1], sys.modules[sub])
    return sys.modules[name]


def _register(modname, name, obj):
    m = _module(modname)
    obj.__module__ = modname
    obj.__qualname__ = name
    obj.__name__ = name
    setattr(m, name, obj)
    return obj


def _rebuild_tensor_v2(*a):
    raise RuntimeError("never called")


def _rebuild_parameter(*a):
    raise RuntimeError("never called")


_register("torch._utils", "_rebuild_tensor_v2", _rebuild_tensor_v2)
_register("torch._utils", "_rebuild_parameter", _rebuild_parameter)
_module("torch")

# dtype name -> (storage class name, struct format, element size, expected.json dtype)
DTYPES = {
    "f64": ("DoubleStorage", "d", 8, "F64"),
    "f32": ("FloatStorage", "f", 4, "F32"),
    "f16": ("HalfStorage", "e", 2, "F16"),
    "bf16": ("BFloat16Storage", None, 2, "BF16"),
    "i64": ("LongStorage", "q", 8, "I64"),
    "i32": ("IntStorage", "i", 4, "I32"),
    "i16": ("ShortStorage", "h", 2, "I16"),
    "i8": ("CharStorage", "b", 1, "I8"),
    "u8": ("ByteStorage", "B", 1, "U8"),
    "bool": ("BoolStorage", "?", 1, "BOOL"),
}
STORAGE_CLASSES = {d: _register("torch", v[0], type(v[0], (), {})) for d, v in DTYPES.items()}


def encode(dtype, values):
    name, fmt, es, _ = DTYPES[dtype]
    if dtype == "bf16":  # values chosen exactly representable: the high half of the float32
        return b"".join(struct.pack("<f", v)[2:] for v in values)
    if dtype == "bool":
        return bytes(1 if v else 0 for v in values)
    return struct.pack("<%d%s" % (len(values), fmt), *values)


class Storage:
    """One storage: raw bytes of `numel` elements of `dtype`, saved under `key`."""

    def __init__(self, dtype, values, key):
        self.dtype, self.values, self.key = dtype, list(values), key
        self.numel = len(self.values)
        self.data = encode(dtype, self.values)


class Tensor:
    """A tensor view: reduces to torch._utils._rebuild_tensor_v2 as torch.Tensor does."""

    def __init__(self, storage, size, stride=None, offset=0, parameter=False):
        self.storage, self.size, self.offset = storage, tuple(size), offset
        if stride is None:
            stride, acc = [], 1
            for s in reversed(size):
                stride.insert(0, acc)
                acc *= s
        self.stride = tuple(stride)
        self.parameter = parameter

    def __reduce_ex__(self, proto):
        t = (_rebuild_tensor_v2, (self.storage, self.offset, self.size, self.stride, False, collections.OrderedDict()))
        if self.parameter:  # nn.Parameter.__reduce_ex__
            return (_rebuild_parameter, (_Plain(t), False, collections.OrderedDict()))
        return t

    def values(self):
        """The tensor's elements in row-major order (what a reader must return)."""
        out = []

        def rec(dim, at):
            if dim == len(self.size):
                out.append(self.storage.values[at])
                return
            for i in range(self.size[dim]):
                rec(dim + 1, at + i * self.stride[dim])

        rec(0, self.offset)
        return out


class _Plain:
    """Wraps a reduce tuple so that a Parameter's data pickles as a plain tensor."""

    def __init__(self, t):
        self.t = t

    def __reduce_ex__(self, proto):
        return self.t


def tensor(dtype, size, key, values=None, **kw):
    n = 1
    for s in size:
        n *= s
    if values is None:
        values = [float(i) * 0.5 - 1.0 if dtype.startswith(("f", "bf")) else (i % 2 == 1 if dtype == "bool" else (i % 100) - (0 if dtype == "u8" else 50)) for i in range(n)]
    return Tensor(Storage(dtype, values, key), size, **kw)


class _NumpyDtype:
    def __init__(self, code):
        self.code = code

    def __reduce__(self):
        return (_np_dtype, (self.code, False, True), (3, "<", None, None, None, -1, -1, 0))


class _NumpyScalar:
    def __init__(self, code, raw):
        self.code, self.raw = code, raw

    def __reduce__(self):
        return (_np_scalar, (_NumpyDtype(self.code), self.raw))


_np_dtype = _register("numpy", "dtype", type("dtype", (), {"__setstate__": lambda self, s: None}))
_np_scalar = _register("numpy.core.multiarray", "scalar", lambda *a: None)
_ModelCheckpoint = _register("pytorch_lightning.callbacks.model_checkpoint", "ModelCheckpoint", type("ModelCheckpoint", (), {}))


def torch_pickle(obj, legacy=False, protocol=2):
    """Pickles obj with torch.save's persistent ids; returns (pickle bytes, storages by key)."""
    storages = {}
    buf = io.BytesIO()

    class P(pickle.Pickler):
        def persistent_id(self, o):
            if isinstance(o, Storage):
                storages[o.key] = o
                pid = ("storage", STORAGE_CLASSES[o.dtype], o.key, "cpu", o.numel)
                return pid + (None,) if legacy else pid
            return None

    P(buf, protocol=protocol).dump(obj)
    return buf.getvalue(), storages


# ---------------------------------------------------------------- containers
def zip_archive(entries, zip64=False, align=64, compress=(), method_override=None, crc_xor=0, usize_override=None, damage=False):
    """A zip of (name, bytes) entries as PyTorchStreamWriter writes it: stored (method 0),
    data aligned to `align` bytes by an 'FB' padding extra field; zip64=True writes every entry
    and the end record with ZIP64 fields (as very large checkpoints need). Entries named in
    `compress` ("*" = all) are deflated (method 8), as re-packing tools write them; the other
    arguments damage the compressed entries (another method number, a wrong CRC, a wrong size, a
    broken deflate stream)."""
    out = bytearray()
    central = bytearray()
    for name, data in entries:
        nb = name.encode()
        method = 8 if (name in compress or "*" in compress) else 0
        stored = zlib.compress(data)[2:-4] if method == 8 else data
        crc = zlib.crc32(data)
        if method == 8:
            crc ^= crc_xor
            if damage:
                stored = bytes([0xFF]) + stored[1:]
            if method_override is not None:
                method = method_override
        ulen = len(data)
        if method == 8 and usize_override is not None:
            ulen = usize_override
        offset = len(out)
        extra = b""
        if zip64:
            extra += struct.pack("<HHQQ", 1, 16, ulen, len(stored))
        pad = (-(offset + 30 + len(nb) + len(extra) + 4)) % align
        extra += struct.pack("<HH", 0x4246, pad) + b"Z" * pad
        size32 = 0xFFFFFFFF if zip64 else len(stored)
        usize32 = 0xFFFFFFFF if zip64 else ulen
        out += struct.pack("<IHHHHHIIIHH", 0x04034B50, 45 if zip64 else 20, 0, method, 0, 0x21, crc, size32, usize32, len(nb), len(extra))
        out += nb + extra + stored
        cextra = struct.pack("<HHQQQ", 1, 24, ulen, len(stored), offset) if zip64 else b""
        off32 = 0xFFFFFFFF if zip64 else offset
        central += struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 45 if zip64 else 20, 45 if zip64 else 20, 0, method, 0, 0x21, crc,
                               size32, usize32, len(nb), len(cextra), 0, 0, 0, 0, off32)
        central += nb + cextra
    cd_off = len(out)
    out += central
    n = len(entries)
    if zip64:
        z64 = len(out)
        out += struct.pack("<IQHHIIQQQQ", 0x06064B50, 44, 45, 45, 0, 0, n, n, len(central), cd_off)
        out += struct.pack("<IIQI", 0x07064B50, 0, z64, 1)
        out += struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, 0xFFFF, 0xFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0)
    else:
        out += struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, n, n, len(central), cd_off, 0)
    return bytes(out)


def torch_zip(obj, archive="archive", zip64=False, protocol=2, byteorder=b"little", pkl=None, drop=(), compress=(), **damage):
    data, storages = torch_pickle(obj, protocol=protocol)
    if pkl is not None:
        data = pkl
    entries = [(archive + "/data.pkl", data)]
    if byteorder is not None:
        entries.append((archive + "/byteorder", byteorder))
    for k in sorted(storages, key=lambda k: int(k) if k.isdigit() else k):
        if k not in drop:
            entries.append((archive + "/data/" + k, storages[k].data))
    entries.append((archive + "/version", b"3\n"))
    entries.append((archive + "/.data/serialization_id", b"1234567890123456789012345678901234567890"))
    return zip_archive(entries, zip64=zip64, compress=compress, **damage)


LEGACY_MAGIC = pickle.dumps(0x1950A86A20F9469CFC6C, protocol=2)


def torch_legacy(obj, obj_pickle=None, cut=None):
    head = LEGACY_MAGIC + pickle.dumps(1001, protocol=2)
    head += pickle.dumps({"protocol_version": 1001, "little_endian": True, "type_sizes": {"short": 2, "int": 4, "long": 4}}, protocol=2)
    data, storages = torch_pickle(obj, legacy=True)
    if obj_pickle is not None:
        data = obj_pickle
    keys = sorted(storages)
    out = head + data + pickle.dumps(keys, protocol=2)
    for k in keys:
        out += struct.pack("<q", storages[k].numel) + storages[k].data
    return out[:cut] if cut else out


# ---------------------------------------------------------------- contents
def state_dict(prefix="", keybase=0, scale=1.0, with_meta=True):
    """An OrderedDict like nn.Module.state_dict(): one tensor of every dtype, a scalar, an empty one."""
    sd = collections.OrderedDict()
    k = keybase
    for dtype, size in [("f32", (2, 3)), ("f16", (3,)), ("bf16", (4,)), ("f64", (2, 2)), ("i64", (3,)), ("i32", (2,)),
                        ("i16", (2,)), ("i8", (3,)), ("u8", (4,)), ("bool", (3,))]:
        t = tensor(dtype, size, str(k))
        if scale != 1.0 and dtype.startswith(("f", "bf")):
            t.storage = Storage(dtype, [v * scale for v in t.storage.values], str(k))
        sd[prefix + "t_" + dtype] = t
        k += 1
    sd[prefix + "scalar"] = tensor("f32", (), str(k), values=[3.25])
    sd[prefix + "empty"] = tensor("f32", (0, 4), str(k + 1), values=[])
    sd[prefix + "param.weight"] = tensor("f32", (2, 2), str(k + 2), parameter=True)
    if with_meta:
        sd._metadata = collections.OrderedDict([("", {"version": 1})])  # what nn.Module.state_dict() attaches
    return sd


def strided_dict():
    base = Storage("f32", [float(i) for i in range(24)], "0")
    sd = collections.OrderedDict()
    sd["whole"] = Tensor(base, (4, 6))
    sd["transposed"] = Tensor(base, (6, 4), stride=(1, 6))      # .t() of whole
    sd["rows_1_3"] = Tensor(base, (2, 6), offset=6)              # whole[1:3] (contiguous, shared storage)
    sd["every_other"] = Tensor(base, (4, 3), stride=(6, 2), offset=1)  # whole[:, 1::2]
    sd["expanded_row"] = Tensor(base, (1, 6), stride=(0, 1), offset=18)  # size-1 dim with stride 0 (as .expand gives)
    return sd


def expected_entry(sd_like):
    out = {}
    for name, t in sd_like.items():
        out[name] = {"dtype": DTYPES[t.storage.dtype][3], "shape": list(t.size),
                     "values": [float(v) if not isinstance(v, bool) else (1.0 if v else 0.0) for v in t.values()]}
    return out


def write(folder, name, data):
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, name), "wb") as f:
        f.write(data)


def valid_files():
    expected = {}
    sd = state_dict()
    write(VALID, "basic_zip.pth", torch_zip(sd))
    expected["basic_zip.pth"] = {"tensors": expected_entry(sd)}
    write(VALID, "basic_legacy.pt", torch_legacy(sd))
    expected["basic_legacy.pt"] = {"tensors": expected_entry(sd)}
    write(VALID, "basic_zip64.pth", torch_zip(sd, zip64=True, archive="basic_zip64"))
    expected["basic_zip64.pth"] = {"tensors": expected_entry(sd)}
    write(VALID, "basic_protocol4.pth", torch_zip(sd, protocol=4, byteorder=None))
    expected["basic_protocol4.pth"] = {"tensors": expected_entry(sd)}
    # every record deflated (as re-packing tools write them; e.g. the realesr-animevideov3 release)
    write(VALID, "basic_deflated.pth", torch_zip(sd, compress=("*",)))
    expected["basic_deflated.pth"] = {"tensors": expected_entry(sd)}
    st = strided_dict()
    write(VALID, "strided_deflated.pth", torch_zip(st, compress=("*",)))
    expected["strided_deflated.pth"] = {"tensors": expected_entry(st)}
    # Real-ESRGAN / BasicSR: {'params': ..., 'params_ema': ...}; the EMA weights are the ones used
    ema = state_dict(keybase=0, scale=2.0)
    plain = state_dict(keybase=100)
    write(VALID, "params_ema.pth", torch_zip({"params": plain, "params_ema": ema}))
    expected["params_ema.pth"] = {"tensors": expected_entry(ema), "metadata": {"pytorch.state_dict_key": "params_ema", "pytorch.unused_keys": "params"}}
    write(VALID, "params.pth", torch_zip({"params": plain}))
    expected["params.pth"] = {"tensors": expected_entry(plain), "metadata": {"pytorch.state_dict_key": "params"}}
    # A Lightning checkpoint (as SD .ckpt files are): state_dict plus training state
    sdw = state_dict(prefix="model.diffusion_model.")
    cb = _ModelCheckpoint()
    cb.__dict__.update({"monitor": None, "best_model_score": None, "save_top_k": -1})
    ckpt = {"epoch": 6, "global_step": _NumpyScalar("i8", struct.pack("<q", 470000)), "pytorch-lightning_version": "1.4.2",
            "state_dict": sdw, "callbacks": {_ModelCheckpoint: {"best_model_score": None}}, "cb_object": cb,
            "optimizer_states": [{"state": {0: {"exp_avg": tensor("f32", (2,), "900")}}}], "lr": 1e-4}
    write(VALID, "lightning.ckpt", torch_zip(ckpt))
    expected["lightning.ckpt"] = {"tensors": expected_entry(sdw), "metadata": {"pytorch.state_dict_key": "state_dict", "epoch": "6",
                                                                                 "global_step": "470000", "pytorch-lightning_version": "1.4.2"}}
    write(VALID, "lightning_legacy.ckpt", torch_legacy(ckpt))
    expected["lightning_legacy.ckpt"] = expected["lightning.ckpt"]
    st = strided_dict()
    write(VALID, "strided.pth", torch_zip(st))
    expected["strided.pth"] = {"tensors": expected_entry(st)}
    write(VALID, "strided_legacy.pt", torch_legacy(st))
    expected["strided_legacy.pt"] = {"tensors": expected_entry(st)}
    m = {"model": state_dict(with_meta=False)}
    write(VALID, "model_wrapper.bin", torch_zip(m, archive="pytorch_model"))
    expected["model_wrapper.bin"] = {"tensors": expected_entry(m["model"]), "metadata": {"pytorch.state_dict_key": "model"}}
    with open(os.path.join(VALID, "expected.json"), "w") as f:
        json.dump(expected, f, indent=1, sort_keys=True)
        f.write("\n")


# ---------------------------------------------------------------- hostile / damaged files
def p2(body):
    return b"\x80\x02" + body + b"."


def u(s):
    b = s.encode()
    return b"X" + struct.pack("<I", len(b)) + b


def one_tensor_pickle(size, stride, offset=0, numel=4, key="0"):
    """{'w': _rebuild_tensor_v2(storage, offset, size, stride, False, OrderedDict())} by hand."""
    def tup(v):
        return b"(" + b"".join(b"J" + struct.pack("<i", x) if -2**31 <= x < 2**31 else b"\x8a\x08" + struct.pack("<q", x) for x in v) + b"t"
    pid = b"(" + u("storage") + b"ctorch\nFloatStorage\n" + u(key) + u("cpu") + b"J" + struct.pack("<i", numel) + b"tQ"
    rebuild = b"ctorch._utils\n_rebuild_tensor_v2\n(" + pid + b"J" + struct.pack("<i", offset) + tup(size) + tup(stride) + \
              b"\x89ccollections\nOrderedDict\n)RtR"
    return p2(b"}" + u("w") + rebuild + b"s")


def zip_with_pickle(pkl, storages=(("0", b"\x00" * 16),), **kw):
    entries = [("archive/data.pkl", pkl), ("archive/byteorder", kw.pop("byteorder", b"little"))]
    entries += [("archive/data/" + k, v) for k, v in storages]
    entries.append(("archive/version", b"3\n"))
    return zip_archive(entries, **kw)


def legacy_with_pickle(pkl, tail=b""):
    head = LEGACY_MAGIC + pickle.dumps(1001, protocol=2)
    head += pickle.dumps({"protocol_version": 1001, "little_endian": True, "type_sizes": {"short": 2, "int": 4, "long": 4}}, protocol=2)
    return head + pkl + tail


class _Evil:
    def __reduce__(self):
        import os as _os
        return (_os.system, ("echo pwned > /tmp/easel_pwned",))


def malformed_files():
    w = lambda name, data: write(MALFORMED, name, data)
    evil = pickle.dumps({"w": _Evil()}, protocol=2)  # GLOBAL posix system + REDUCE: the classic payload
    w("pt_os_system.pth", zip_with_pickle(evil))
    w("pt_os_system_legacy.pt", legacy_with_pickle(evil))
    w("pt_os_system_protocol0.pth", zip_with_pickle(b"cos\nsystem\n(S'echo pwned'\ntR."))
    w("pt_eval.pth", zip_with_pickle(p2(b"cbuiltins\neval\n" + u("1+1") + b"\x85R")))
    w("pt_stack_global_popen.pth", zip_with_pickle(b"\x80\x04" + b"\x8c\nsubprocess\x8c\x05Popen\x93" + b"\x8c\x02ls\x85R."))
    w("pt_inst.pth", zip_with_pickle(b"(S'ls'\nios\nsystem\n."))
    w("pt_ext1.pth", zip_with_pickle(p2(b"\x82\x01")))
    w("pt_numpy_ndarray.pth", zip_with_pickle(p2(b"cnumpy.core.multiarray\n_reconstruct\n)R")))
    w("pt_torchscript.pt", zip_with_pickle(p2(b"c__torch__\nModel\n)\x81")))
    w("pt_reduce_storage_type.pth", zip_with_pickle(p2(b"ctorch\nFloatStorage\n)R")))
    w("pt_build_on_list.pth", zip_with_pickle(p2(b"]}b")))
    # deep nesting: 100000 lists, each appended into the one before (built without recursion)
    n = 20000
    w("pt_deep_nesting.pth", zip_with_pickle(p2(b"}" + u("a") + b"]" * n + b"a" * (n - 1) + b"s")))
    w("pt_deep_mark.pth", zip_with_pickle(p2(b"(" * 50000 + b"}")))
    # a list that contains itself (through the memo)
    w("pt_cycle.pth", zip_with_pickle(p2(b"}" + u("a") + b"]q\x00h\x00as")))
    w("pt_huge_size.pth", zip_with_pickle(one_tensor_pickle([2**40, 2**40], [2**40, 1])))
    w("pt_size_past_storage.pth", zip_with_pickle(one_tensor_pickle([2**31 - 1, 2**31 - 1], [2**31 - 1, 1])))
    w("pt_offset_out_of_range.pth", zip_with_pickle(one_tensor_pickle([4], [1], offset=1000)))
    w("pt_negative_size.pth", zip_with_pickle(one_tensor_pickle([-4], [1])))
    w("pt_too_many_dims.pth", zip_with_pickle(one_tensor_pickle([1] * 12, [1] * 12)))
    w("pt_broadcast.pth", zip_with_pickle(one_tensor_pickle([1000], [0])))
    w("pt_storage_short.pth", zip_with_pickle(one_tensor_pickle([4], [1], numel=4), storages=(("0", b"\x00" * 8),)))
    w("pt_storage_missing.pth", zip_with_pickle(one_tensor_pickle([4], [1], key="7")))
    w("pt_storage_huge_numel.pth", zip_with_pickle(one_tensor_pickle([4], [1], numel=2**31 - 1)))
    small = one_tensor_pickle([4], [1])
    w("pt_deflate_bad_crc.pth", zip_with_pickle(small, compress=("archive/data/0",), crc_xor=1))
    w("pt_deflate_damaged.pth", zip_with_pickle(small, compress=("archive/data.pkl",), damage=True))
    w("pt_deflate_short.pth", zip_with_pickle(small, compress=("archive/data/0",), usize_override=32))
    w("pt_deflate_ratio.pth", zip_with_pickle(small, compress=("archive/data/0",), usize_override=10**9))
    w("pt_zip_method_12.pth", zip_with_pickle(small, compress=("archive/data/0",), method_override=12))
    w("pt_big_endian.pth", zip_with_pickle(one_tensor_pickle([4], [1]), byteorder=b"big"))
    good = torch_zip(state_dict())
    w("pt_truncated_zip.pth", good[: len(good) // 2])
    w("pt_truncated_end.pth", good[:-5])
    w("pt_truncated_pickle.pth", zip_with_pickle(one_tensor_pickle([4], [1])[:-9]))
    bad_local = bytearray(good)
    bad_local[0:4] = b"PK\x03\x04"
    bad_local[30:40] = b"XXXXXXXXXX"  # the first local header's name no longer matches the directory
    w("pt_local_name_mismatch.pth", bytes(bad_local))
    cd = bytearray(good)
    eocd = cd.rfind(b"PK\x05\x06")
    cd[eocd + 16:eocd + 20] = struct.pack("<I", len(cd) + 1000)
    w("pt_cd_outside.pth", bytes(cd))
    w("pt_no_data_pkl.pth", zip_archive([("archive/other.txt", b"hello")]))
    w("pt_empty_zip.pth", zip_archive([]))
    w("pt_no_tensors.pth", zip_with_pickle(p2(b"}" + u("epoch") + b"K\x03s")))
    w("pt_list_root.pth", zip_with_pickle(p2(b"]")))
    w("pt_no_stop.pth", zip_with_pickle(b"\x80\x02}"))
    w("pt_get_unknown.pth", zip_with_pickle(p2(b"}" + u("a") + b"j\xff\xff\xff\xffs")))
    w("pt_bad_opcode.pth", zip_with_pickle(p2(b"\xff")))
    w("pt_protocol_9.pth", zip_with_pickle(b"\x80\x09}."))
    w("pt_string_past_end.pth", zip_with_pickle(b"\x80\x02X\xff\xff\xff\x7fabc."))
    w("pt_not_utf8.pth", zip_with_pickle(p2(b"}X\x02\x00\x00\x00\xff\xfeK\x01s")))
    w("pt_persid_not_storage.pth", zip_with_pickle(p2(b"}" + u("a") + u("x") + b"Qs")))
    w("pt_text.pth", b"this is not a checkpoint\n" * 4)
    w("pt_tar.pth", b"archive/data.pkl".ljust(257, b"\x00") + b"ustar\x0000" + b"\x00" * 250)
    w("pt_legacy_truncated.pt", torch_legacy(state_dict(), cut=len(torch_legacy(state_dict())) - 20))
    w("pt_legacy_bad_protocol.pt", LEGACY_MAGIC + pickle.dumps(999, protocol=2))
    w("pt_legacy_key_unnamed.pt", legacy_with_pickle(one_tensor_pickle([4], [1]), pickle.dumps(["5"], protocol=2) + struct.pack("<q", 4) + b"\0" * 16))


def seeds():
    for name in ["basic_zip.pth", "basic_legacy.pt", "params_ema.pth", "strided.pth", "lightning.ckpt", "basic_protocol4.pth", "strided_deflated.pth"]:
        with open(os.path.join(VALID, name), "rb") as f:
            write(SEEDS, name, f.read())
    # raw pickles for fuzz_pickle
    write(SEEDS, "state_dict.pkl", torch_pickle(state_dict())[0])
    write(SEEDS, "lightning.pkl", torch_pickle({"state_dict": state_dict(), "global_step": _NumpyScalar("i8", b"\x01" * 8)})[0])
    write(SEEDS, "protocol4.pkl", torch_pickle(strided_dict(), protocol=4)[0])
    write(SEEDS, "os_system.pkl", pickle.dumps({"w": _Evil()}, protocol=2))


if __name__ == "__main__":
    valid_files()
    malformed_files()
    seeds()
    print("wrote", VALID, MALFORMED, SEEDS)
