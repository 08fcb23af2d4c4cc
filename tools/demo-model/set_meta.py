"""Sets or removes keys of a safetensors file's __metadata__ without touching its tensor bytes (stdlib only).

  python3 tools/demo-model/set_meta.py FILE easel.sampler=euler easel.cfg_scale=5 [key= (empty: removed)] [--out OUT]

The header is rewritten (the metadata keys in their order, new ones last; the tensor entries unchanged, padded with spaces to a multiple of 8
bytes as the safetensors writers do); the data section is copied byte for byte, and its sha256 is checked
before and after. Without --out the file is replaced (through a temporary file beside it)."""

import argparse
import hashlib
import json
import os
import struct
import sys


def read(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    return header, data


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("file")
    ap.add_argument("pairs", nargs="+", help="key=value (value empty: the key is removed)")
    ap.add_argument("--out")
    a = ap.parse_args()
    header, data = read(a.file)
    meta = dict(header.pop("__metadata__", None) or {})
    for p in a.pairs:
        if "=" not in p:
            sys.exit(f"set_meta: '{p}' is not key=value")
        k, v = p.split("=", 1)
        if v:
            meta[k] = v
        else:
            meta.pop(k, None)
    out = {"__metadata__": meta}
    out.update(header)
    raw = json.dumps(out, separators=(",", ":")).encode()
    raw += b" " * ((8 - len(raw) % 8) % 8)
    dst = a.out or a.file
    tmp = dst + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        f.write(data)
    h2, d2 = read(tmp)
    if hashlib.sha256(d2).digest() != hashlib.sha256(data).digest() or \
            {k: v for k, v in h2.items() if k != "__metadata__"} != header:
        os.remove(tmp)
        sys.exit("set_meta: the rewritten file does not hold the same tensors; nothing written")
    os.replace(tmp, dst)
    print(f"{dst}: metadata {json.dumps({k: h2['__metadata__'][k] for k in sorted(h2['__metadata__']) if k.startswith('easel.')})}; "
          f"tensor data sha256 {hashlib.sha256(d2).hexdigest()} unchanged")


if __name__ == "__main__":
    main()
