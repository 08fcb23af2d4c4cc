#!/usr/bin/env python3
"""Writes [[name, dtype, shape], ...] key lists (tests/data/io/keys) from a PyTorch zip checkpoint (.pth, without torch:
tensor rebuild calls are stubbed while unpickling) or a .safetensors header. Usage: keylists.py FILE > out.json"""
import json, struct, sys
if sys.argv[1].endswith(".safetensors"):
    fh = open(sys.argv[1], "rb"); n = struct.unpack("<Q", fh.read(8))[0]; h = json.loads(fh.read(n))
    print(json.dumps([[k, v["dtype"], v["shape"]] for k, v in h.items() if k != "__metadata__" and not k.startswith("__")]))
    sys.exit(0)
import zipfile, pickle, collections
class Stub:
    def __init__(self, name): self.name=name
    def __call__(self, *a, **k): return (self.name, a)
def rebuild(storage, off, size, stride, *rest): return {"shape": list(size), "dtype": storage}
class U(pickle.Unpickler):
    def find_class(self, mod, name):
        if name == "_rebuild_tensor_v2": return rebuild
        if mod == "collections" and name == "OrderedDict": return collections.OrderedDict
        if name.endswith("Storage"): return name
        return Stub(mod+"."+name)
    def persistent_load(self, pid):
        return {"FloatStorage":"F32","HalfStorage":"F16","BFloat16Storage":"BF16"}.get(pid[1] if isinstance(pid[1],str) else "", str(pid[1]))
z=zipfile.ZipFile(sys.argv[1])
pk=[n for n in z.namelist() if n.endswith("data.pkl")][0]
d=U(z.open(pk)).load()
if "params" in d: d=d["params"]
if "params_ema" in d: d=d["params_ema"]
out=[[k, v["dtype"], v["shape"]] for k,v in d.items() if isinstance(v, dict) and "shape" in v]
print(json.dumps(out))
