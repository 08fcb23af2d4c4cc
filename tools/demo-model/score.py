"""The demo model's automatic scorer: what one image of "a {size} {colour} {shape} {position}, {bg} background"
shows, measured (plain torch, CPU or GPU; no learnt weights).

analyse(img) -> dict, img float [3, H, W] in [0, 1]:
  bg       palette colour nearest the per-channel median of a 6-pixel border (as before: the C++ port in
           tests/e2e/demo_checks_test.cpp reads bg, colour, cx, cy, area and must keep agreeing)
  colour   palette colour nearest the per-channel median of the object pixels (every pixel farther than
           0.25, RGB distance, from the border median)
  cx, cy   centroid of those pixels (fractions of the side, y down); area: their fraction of the image
  shape    circle / square / triangle / star / ring / cross, or None (no object), from the object's
           silhouette (_shape_features, classify_shape):
             - the silhouette: the largest 8-connected component of the pixels nearer the object colour than
               the background colour (the alpha = 0.5 edge of an anti-aliased drawing), specks removed;
             - hole = share of the filled silhouette that is enclosed background (a ring: 0.19, else 0);
             - the radial signature r(theta): the farthest silhouette pixel from the centroid in each of 72
               angle bins, divided by its mean; its Fourier magnitudes a_k (k = 1..8) are rotation invariant:
               a triangle peaks at k = 3, a square and a cross at k = 4 (the cross 3-4x higher), a star at
               k = 5, a circle nowhere.
  shape_scores   the features above, for the record
  edge_px  mean width in pixels of the fg/bg transition (alpha 0.1..0.9 pixels per boundary pixel): about 1 for
           the anti-aliased training pictures, more for blurred drawings
  speck_px pixels of the largest cluster of "stray" colour: farther than 0.2 (RGB) from the segment between the
           background and object colours (every pixel of a training picture lies on it: alpha blending), or
           of a second non-background component; speck = speck_px >= 6
  frame    largest deviation (RGB distance) from the background median of the mean background colour in a band
           4 pixels wide at 0..40 pixels from the image edge (background pixels only, away from the object);
           frame_flag = frame > 0.035 (9/255)

check(attrs, res) -> {"bg", "colour", "pos", "size", "shape"} booleans (pos/size as before: left cx < 0.42,
right cx > 0.58, top cy < 0.42, bottom cy > 0.58, centre within 0.1 of the middle; small area < 6 %, large > 6 %)
and "clean" (no speck and no frame).
"""

import math

import torch
import torch.nn.functional as F

import shapes

PALETTE_NAMES = shapes.COLOUR_NAMES
_PAL = torch.tensor([shapes.COLOURS[n] for n in PALETTE_NAMES])
NBINS = 72


try:
    import numpy as np
    from scipy import ndimage
except ImportError:  # the torch fallbacks below (slower on the CPU)
    ndimage = None


def _components(mask):
    """8-connected component labels of a bool mask [H, W] -> (labels int [H, W], 0 = outside; list of
    (label, pixel count), largest first). scipy.ndimage.label where scipy is there, else label propagation
    (every pixel takes the largest label among its 3x3 neighbours within the mask until nothing changes)."""
    H, W = mask.shape
    if not bool(mask.any()):
        return torch.zeros((H, W), dtype=torch.long, device=mask.device), []
    if ndimage is not None:
        lab_np, n = ndimage.label(mask.cpu().numpy(), structure=np.ones((3, 3), dtype=bool))
        counts = np.bincount(lab_np.ravel(), minlength=n + 1)[1:]
        order = np.argsort(-counts, kind="stable")
        return torch.from_numpy(lab_np).long().to(mask.device), [(int(i) + 1, int(counts[i])) for i in order]
    lab = torch.arange(1, H * W + 1, device=mask.device, dtype=torch.float32).view(1, 1, H, W) * mask
    m = mask.view(1, 1, H, W).float()
    for _ in range(4 * (H + W)):
        new = F.max_pool2d(lab, 3, 1, 1) * m
        if torch.equal(new, lab):
            break
        lab = new
    lab = lab.view(H, W).long()
    ids, counts = torch.unique(lab[mask], return_counts=True)
    order = counts.argsort(descending=True)
    return lab, [(int(ids[i]), int(counts[i])) for i in order]


def _fill_holes(obj):
    """obj bool [H, W] -> (filled, holes): holes = background pixels not connected (4-neighbourhood) to the
    outside of the object's bounding box. Works on the box plus a 1-pixel margin."""
    if ndimage is not None:
        filled = torch.from_numpy(ndimage.binary_fill_holes(obj.cpu().numpy())).to(obj.device)
        return filled, filled & ~obj
    ys, xs = torch.nonzero(obj, as_tuple=True)
    y0, y1 = max(int(ys.min()) - 1, 0), min(int(ys.max()) + 2, obj.shape[0])
    x0, x1 = max(int(xs.min()) - 1, 0), min(int(xs.max()) + 2, obj.shape[1])
    box = F.pad(obj[y0:y1, x0:x1].float(), (1, 1, 1, 1))  # a margin of background all round
    free = (1 - box)[None, None]
    out = torch.zeros_like(free)
    out[..., 0, :] = out[..., -1, :] = 1
    out[..., :, 0] = out[..., :, -1] = 1
    out = out * free
    k = torch.tensor([[0.0, 1, 0], [1, 1, 1], [0, 1, 0]], device=obj.device).view(1, 1, 3, 3)
    for _ in range(4 * (box.shape[0] + box.shape[1])):
        new = (F.conv2d(out, k, padding=1) > 0).float() * free
        if torch.equal(new, out):
            break
        out = new
    holes_box = (free - out)[0, 0, 1:-1, 1:-1] > 0
    holes = torch.zeros_like(obj)
    holes[y0:y1, x0:x1] = holes_box
    return obj | holes, holes


def _shape_features(sil):
    """sil: bool [H, W] silhouette of one object -> dict(hole, a1..a8, n) (see the module docstring)."""
    filled, holes = _fill_holes(sil)
    n = int(filled.sum())
    hole = float(holes.sum()) / max(1, n)
    ys, xs = torch.nonzero(filled, as_tuple=True)
    yf, xf = ys.float() + 0.5, xs.float() + 0.5
    cy, cx = yf.mean(), xf.mean()
    dx, dy = xf - cx, -(yf - cy)
    r = torch.sqrt(dx * dx + dy * dy)
    th = torch.atan2(dy, dx)
    b = ((th + math.pi) / (2 * math.pi) * NBINS).long().clamp(0, NBINS - 1)
    # the farthest point of each pixel (its outer corner, half a pixel diagonal further out) per bin
    rmax = torch.zeros(NBINS, device=sil.device).scatter_reduce(0, b, r + 0.5, reduce="amax", include_self=True)
    if bool((rmax == 0).any()):  # an empty bin (a very thin or tiny object): take its neighbours' mean
        z = rmax == 0
        rmax[z] = ((rmax.roll(1) + rmax.roll(-1)) / 2)[z]
    s = rmax / rmax.mean()
    ang = (torch.arange(NBINS, device=sil.device, dtype=torch.float32) + 0.5) / NBINS * 2 * math.pi
    feats = {"hole": hole, "n": n}
    for k in range(1, 9):
        re = (s * torch.cos(k * ang)).mean()
        im = (s * torch.sin(k * ang)).mean()
        feats[f"a{k}"] = float(2 * torch.sqrt(re * re + im * im))
    return feats


def classify_shape(f):
    """The features of _shape_features -> shape name. Thresholds fitted on the procedural drawings of
    shapes.py (validate(): every shape, size, rotation and colour pair)."""
    if f["hole"] > 0.06:
        return "ring"
    a3, a4, a5 = f["a3"], f["a4"], f["a5"]
    if a5 > 0.12 and a5 > a3 and a5 > a4:
        return "star"
    if a3 > 0.10 and a3 > a4:
        return "triangle"
    if a4 > 0.25:
        return "cross"
    if a4 > 0.07:
        return "square"
    return "circle"


def _nearest(c):
    return PALETTE_NAMES[int(((_PAL.to(c.device) - c) ** 2).sum(1).argmin())]


def _dilate(mask, r):
    """bool [H, W] dilated by a (2r+1) x (2r+1) square (separable max pools)."""
    m = mask[None, None].float()
    m = F.max_pool2d(m, (2 * r + 1, 1), 1, (r, 0))
    m = F.max_pool2d(m, (1, 2 * r + 1), 1, (0, r))
    return m[0, 0] > 0


def analyse(img):
    """img float [3, H, W] in [0, 1] -> dict (module docstring)."""
    img = img.float()
    H, W = img.shape[1:]
    border = torch.cat([img[:, :6].reshape(3, -1), img[:, -6:].reshape(3, -1), img[:, :, :6].reshape(3, -1),
                        img[:, :, -6:].reshape(3, -1)], 1)
    bgm = border.median(1).values
    out = {"bg": _nearest(bgm), "colour": None, "cx": None, "cy": None, "area": 0.0, "shape": None,
           "shape_scores": None, "edge_px": None, "stray": 0.0, "speck_px": 0, "speck": False, "frame": 0.0,
           "frame_flag": False}
    d = ((img - bgm[:, None, None]) ** 2).sum(0).sqrt()
    m = d > 0.25
    out["area"] = m.float().mean().item()
    if m.sum() < 4:
        out["frame"] = _frame(img, bgm, torch.zeros_like(m))
        out["frame_flag"] = out["frame"] > FRAME_LIMIT
        return out
    obj = img[:, m].median(1).values
    out["colour"] = _nearest(obj)
    ys, xs = torch.nonzero(m, as_tuple=True)
    out["cx"] = (xs.float().mean().item() + 0.5) / W
    out["cy"] = (ys.float().mean().item() + 0.5) / H
    # alpha of every pixel along the segment bg -> object colour, and its distance from the segment
    seg = obj - bgm
    L2 = float((seg * seg).sum())
    rel = img - bgm[:, None, None]
    alpha = ((rel * seg[:, None, None]).sum(0) / max(L2, 1e-6)).clamp(0, 1)
    off = ((rel - alpha[None] * seg[:, None, None]) ** 2).sum(0).sqrt()
    lab, comps = _components(alpha > 0.5)
    sil = lab == comps[0][0]
    f = _shape_features(sil)
    out["shape"] = classify_shape(f)
    out["shape_scores"] = {k: round(v, 4) if isinstance(v, float) else v for k, v in f.items()}
    # transition width: pixels with alpha in (0.1, 0.9) near the object per boundary pixel of its silhouette
    trans = ((alpha > 0.1) & (alpha < 0.9) & _dilate(sil, 4)).sum()
    perim = (sil & _dilate(~sil, 1)).sum()  # silhouette pixels with a non-silhouette 8-neighbour
    out["edge_px"] = round(float(trans) / max(1, int(perim)), 3)
    # specks: small clusters of stray colour (off the bg-object segment: a clean drawing has none) and small
    # detached pieces; a large stray area is an unevenly coloured object (stray: its share of the object)
    stray = off > 0.2
    out["stray"] = round(float((stray & _dilate(sil, 2)).sum()) / max(1, int(sil.sum())), 4)
    slab, sc = _components(stray)
    pieces = [c for _, c in comps[1:]] + [c for i, c in sc if SPECK_MIN <= c <= SPECK_MAX and _small(slab == i)]
    out["speck_px"] = max([c for c in pieces if c <= SPECK_MAX], default=0)
    out["speck"] = out["speck_px"] >= SPECK_MIN
    out["frame"] = _frame(img, bgm, alpha > 0.1)
    out["frame_flag"] = out["frame"] > FRAME_LIMIT
    return out


SPECK_MIN, SPECK_MAX = 6, 400  # pixels of a speck (a 256x256 image)
FRAME_LIMIT = 0.02  # RGB distance (5/255)


def _small(mask):
    """True if the mask's bounding box fits in 24 x 24 pixels."""
    ys, xs = torch.nonzero(mask, as_tuple=True)
    return int(ys.max() - ys.min()) < 24 and int(xs.max() - xs.min()) < 24


def _frame(img, bgm, fg):
    """Largest RGB deviation of the mean background colour in 2-pixel bands at 0..40 pixels from the image edge
    from the mean background colour farther in (40 pixels or more from the edge; bgm if too little is there).
    Background pixels only: those within 16 pixels of fg (the object and its soft edge) are left out."""
    H, W = img.shape[1:]
    away = ~_dilate(fg, 16)
    yy = torch.arange(H, device=img.device)[:, None].expand(H, W)
    xx = torch.arange(W, device=img.device)[None, :].expand(H, W)
    dist = torch.minimum(torch.minimum(yy, H - 1 - yy), torch.minimum(xx, W - 1 - xx))
    inner = away & (dist >= 40)
    ref = img[:, inner].mean(1) if int(inner.sum()) >= 256 else bgm
    worst = 0.0
    for b0 in range(0, 40, 2):
        sel = away & (dist >= b0) & (dist < b0 + 2)
        if int(sel.sum()) < 64:
            continue
        mean = img[:, sel].mean(1)
        worst = max(worst, float(((mean - ref) ** 2).sum().sqrt()))
    return round(worst, 4)


def check(attr, res):
    """attr: dict(size, colour, shape, pos, bg); res: analyse() -> dict of booleans."""
    out = {"bg": res["bg"] == attr["bg"], "colour": res["colour"] == attr["colour"],
           "shape": res["shape"] == attr["shape"], "clean": not (res["speck"] or res["frame_flag"])}
    cx, cy, area = res["cx"], res["cy"], res["area"]
    if cx is None:
        out.update(pos=False, size=False)
        return out
    p = attr["pos"]
    out["pos"] = {"left": cx < 0.42, "right": cx > 0.58, "top": cy < 0.42, "bottom": cy > 0.58,
                  "centre": abs(cx - 0.5) < 0.1 and abs(cy - 0.5) < 0.1}[p]
    out["size"] = area < 0.06 if attr["size"] == "small" else area > 0.06
    return out


ATTRS = ("bg", "colour", "shape", "pos", "size")


def analyse_u8(arr):
    """analyse() of one 8-bit H x W x 3 picture (numpy), as saved to PNG (for worker processes)."""
    return analyse(torch.from_numpy(arr).permute(2, 0, 1).float() / 255)


def worker_init():
    torch.set_num_threads(1)


def validate(n=1200, size=256, seed=0, device="cpu", u8=True):
    """The scorer on the procedural drawings themselves (ground truth known): n images of every shape, size,
    position, rotation, colour and background (held-out pairs too), rounded to 8 bits as a saved picture is
    (u8) -> accuracy per attribute, confusion of the shapes, and the speck / frame false-positive rates."""
    cg = torch.Generator().manual_seed(seed)
    dg = torch.Generator(device=device).manual_seed(seed + 1)
    tally = {k: 0 for k in ATTRS + ("clean",)}
    conf = {}
    worst = {"speck_px": 0, "frame": 0.0, "edge_px": 0.0}
    done = 0
    while done < n:
        k = min(64, n - done)
        attrs, _ = shapes.sample_attributes(k, cg, allow_heldout=True)
        x = shapes.render(attrs, size, device, dg)
        for a, im in zip(attrs, x):
            im = (im + 1) / 2
            if u8:
                im = (im * 255).round() / 255
            r = analyse(im)
            c = check(a, r)
            for key in tally:
                tally[key] += int(c[key])
            conf[(a["shape"], r["shape"])] = conf.get((a["shape"], r["shape"]), 0) + 1
            worst["speck_px"] = max(worst["speck_px"], r["speck_px"])
            worst["frame"] = max(worst["frame"], r["frame"])
            worst["edge_px"] = max(worst["edge_px"], r["edge_px"] or 0)
        done += k
    return {"n": n, "accuracy": {k: v / n for k, v in tally.items()},
            "shape_confusion": {f"{a}->{b}": v for (a, b), v in sorted(conf.items(), key=str) if a != b},
            "worst_clean": worst}


if __name__ == "__main__":
    import json
    import sys

    print(json.dumps(validate(int(sys.argv[1]) if len(sys.argv) > 1 else 600, seed=int(sys.argv[2]) if len(sys.argv) > 2
                              else 0), indent=1))
