"""The demo model's scorer on easel's own images (CPU): the prompt sets of train.py (prompt_sets(): in-distribution
pairs, held-out (colour, shape) pairs, held-out phrasings) and its 12 test prompts, drawn by `easel generate` at the
settings the model file recommends (no sampler / CFG / steps / size flags: its easel.* metadata), scored with
score.py exactly as train.py scores the GPU (diffusers) images.

  /usr/bin/python3 tools/demo-model/easel_score.py [--model FILE] [--n 24] [--sets random,heldout,phrasings,test]
      [--out DIR] [--easel build/bin/easel] [--threads 2] [--json OUT.json]

Needs torch (CPU), numpy, scipy and PIL (Debian: python3-torch python3-numpy python3-scipy python3-pil). Image i of a
set uses seed i + 1 with easel's --rng cpu (test prompts: seed 1); the images stay in --out (default: a temporary
folder, removed)."""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch
from PIL import Image

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import score  # noqa: E402
import train  # noqa: E402  (prompt_sets, TEST_PROMPTS, parse_prompt; imports torch only)

ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "demo", "easel-demo-shapes.safetensors"))
    ap.add_argument("--easel", default=os.path.join(ROOT, "build", "bin", "easel"))
    ap.add_argument("--n", type=int, default=24, help="prompts per set (the GPU figures: 64)")
    ap.add_argument("--sets", default="random,heldout,phrasings,test")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out")
    ap.add_argument("--json")
    ap.add_argument("--extra", default="", help="more easel flags, space separated (e.g. '--cfg-scale 5')")
    a = ap.parse_args()
    out = a.out or tempfile.mkdtemp(prefix="easel_score_")
    os.makedirs(out, exist_ok=True)
    sets = train.prompt_sets(64)
    jobs = {}
    for name in a.sets.split(","):
        if name == "test":
            jobs[name] = [(train.parse_prompt(p), p, 1) for p in train.TEST_PROMPTS]
        else:
            attrs, caps = sets[name]
            jobs[name] = [(at, c, i + 1) for i, (at, c) in enumerate(zip(attrs[:a.n], caps[:a.n]))]
    summary = {"model": os.path.basename(a.model), "settings": "the file's easel.* metadata" + (f" + {a.extra}" if a.extra else ""),
               "rng": "cpu"}
    t_all = time.time()
    for name, items in jobs.items():
        tally = {k: 0 for k in score.ATTRS + ("clean", "all")}
        specks = frames = 0
        edge = []
        secs = []
        for k, (at, cap, seed) in enumerate(items):
            png = os.path.join(out, f"{name}_{k:02d}.png")
            t0 = time.time()
            subprocess.run([a.easel, "generate", "-m", a.model, "-p", cap, "-s", str(seed), "--rng", "cpu", "-t", str(a.threads),
                            "--no-cache", "-o", png] + a.extra.split(), check=True, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
            secs.append(time.time() - t0)
            img = np.asarray(Image.open(png).convert("RGB"))
            r = score.analyse(torch.from_numpy(img.copy()).permute(2, 0, 1).float() / 255)
            c = score.check(at, r)
            for key in score.ATTRS + ("clean",):
                tally[key] += int(c[key])
            tally["all"] += int(all(c[key] for key in score.ATTRS))
            specks += int(r["speck"])
            frames += int(r["frame_flag"])
            if r["edge_px"] is not None:
                edge.append(r["edge_px"])
            bad = [key for key in score.ATTRS if not c[key]]
            print(f"{name} {k:2d} seed {seed}: {cap!r}: {'ok' if not bad else 'WRONG ' + ','.join(bad)}"
                  f"{' speck' if r['speck'] else ''}{' frame' if r['frame_flag'] else ''} ({secs[-1]:.1f} s)", flush=True)
        n = len(items)
        res = {k: v / n for k, v in tally.items()}
        res.update(speck=specks / n, frame=frames / n, edge_px=float(np.mean(edge)) if edge else None, n=n,
                   wall_s_per_image=float(np.median(secs)))
        summary[name] = res
        print(name, json.dumps(res), flush=True)
    summary["total_s"] = time.time() - t_all
    if a.json:
        with open(a.json, "w") as f:
            json.dump(summary, f, indent=1)
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
