"""Procedural "shapes" dataset for the easel demo model, generated on the fly with torch (GPU or CPU).

Each sample is one filled shape on a plain background, with a caption such as
  "a small red circle on the left, blue background".
Vocabulary (see the model card, models/demo/README.md):
  shapes     circle, square, triangle, star, ring, cross
  colours    red, green, blue, yellow, orange, purple, pink, white, black, cyan, brown, grey
  positions  on the left, on the right, at the top, at the bottom, in the centre ("in the center" too)
  sizes      small, large
  background any colour above, different from the object's colour
Parts of the caption are dropped at random (size, position, background: 15 % each) so shorter prompts
work; held-out (colour, shape) pairs never appear in training (new combinations for the model card).
With `phrasings` > 0 (run 11 on) that share of the captions takes one of the other phrasings of PHRASINGS
instead (word orders and joining words; never dropped parts); HELDOUT_PHRASINGS are never used in training
and test whether the model reads the words rather than one word order. With `hard_pairs` > 0 that share of
the samples takes a background among the 3 palette colours nearest the object's (the pairs the model has to
tell apart, e.g. red / orange / brown, orange / yellow, pink / white).
Images: float [B, 3, S, S] in [-1, 1] (NCHW), anti-aliased edges (about one pixel).
"""

import math

import torch

SHAPES = ["circle", "square", "triangle", "star", "ring", "cross"]
COLOURS = {
    "red": (0.86, 0.10, 0.10), "green": (0.10, 0.70, 0.20), "blue": (0.10, 0.25, 0.90),
    "yellow": (0.95, 0.85, 0.10), "orange": (1.00, 0.55, 0.00), "purple": (0.55, 0.15, 0.75),
    "pink": (1.00, 0.55, 0.75), "white": (0.97, 0.97, 0.97), "black": (0.05, 0.05, 0.05),
    "cyan": (0.10, 0.85, 0.90), "brown": (0.50, 0.30, 0.10), "grey": (0.50, 0.50, 0.50),
}
COLOUR_NAMES = list(COLOURS)
POSITIONS = ["left", "right", "top", "bottom", "centre"]
POSITION_PHRASES = {"left": "on the left", "right": "on the right", "top": "at the top", "bottom": "at the bottom",
                    "centre": "in the centre"}
# (centre x, centre y) as fractions of the image side; y grows downwards
POSITION_XY = {"left": (0.28, 0.5), "right": (0.72, 0.5), "top": (0.5, 0.28), "bottom": (0.5, 0.72),
               "centre": (0.5, 0.5)}
SIZES = ["small", "large"]
# circumradius as a fraction of the image side
SIZE_RADIUS = {"small": (0.09, 0.12), "large": (0.20, 0.24)}
# (colour, shape) pairs never shown in training
HELDOUT = {("green", "star"), ("purple", "triangle"), ("yellow", "ring"), ("red", "cross"), ("blue", "square"),
           ("orange", "circle")}


# Other phrasings of the same caption (run 11 on): {pos} is the position phrase ("on the left", ...)
PHRASINGS = [
    "a {size} {colour} {shape} {pos} on a {bg} background",
    "{bg} background, a {size} {colour} {shape} {pos}",
    "{pos}, a {size} {colour} {shape}, {bg} background",
    "a {colour} {shape}, {size}, {pos}, {bg} background",
]
# Phrasings never shown in training (the scorer's held-out phrasings): new combinations of the trained
# pieces, and one with a joining word ("with") that no training caption has
HELDOUT_PHRASINGS = [
    "{pos}, a {size} {colour} {shape} on a {bg} background",
    "on a {bg} background, a {size} {colour} {shape} {pos}",
    "a {size} {colour} {shape} {pos} with a {bg} background",
]


def _rgb_dist(a, b):
    return math.sqrt(sum((x - y) ** 2 for x, y in zip(COLOURS[a], COLOURS[b])))


# the 3 palette colours nearest each colour (RGB distance): the hard (object, background) pairs
NEAREST = {c: sorted((o for o in COLOURS if o != c), key=lambda o: _rgb_dist(c, o))[:3] for c in COLOURS}


def phrase(template, size, colour, shape, pos, bg):
    """One of PHRASINGS / HELDOUT_PHRASINGS filled in (the full caption: no part dropped)."""
    return template.format(size=size, colour=colour, shape=shape, pos=POSITION_PHRASES[pos], bg=bg)


def caption(size, colour, shape, pos, bg, drop_size=False, drop_pos=False, drop_bg=False, center_spelling=False):
    """Caption template: "a {size} {colour} {shape} {position phrase}, {bg} background" with optional parts."""
    words = ["a"] + ([] if drop_size else [size]) + [colour, shape]
    text = " ".join(words)
    if not drop_pos:
        phrase = POSITION_PHRASES[pos]
        if pos == "centre" and center_spelling:
            phrase = "in the center"
        text += " " + phrase
    if not drop_bg:
        text += f", {bg} background"
    return text


def sample_attributes(n, gen, allow_heldout=False, phrasings=0.0, hard_pairs=0.0):
    """Random attribute indices (CPU generator gen) -> list of dicts and caption strings. phrasings /
    hard_pairs: shares of other phrasings and of hard colour pairs (module docstring); with both 0 the draws
    are exactly those of runs 1-10."""
    r = lambda k: torch.randint(0, k, (n,), generator=gen).tolist()  # noqa: E731
    sh, co, po, si, bg = r(len(SHAPES)), r(len(COLOURS)), r(len(POSITIONS)), r(len(SIZES)), r(len(COLOURS) - 1)
    drops = torch.rand((n, 4), generator=gen).tolist()
    extra = torch.rand((n, 4), generator=gen).tolist() if (phrasings or hard_pairs) else None
    attrs, caps = [], []
    for i in range(n):
        shape, colour = SHAPES[sh[i]], COLOUR_NAMES[co[i]]
        if not allow_heldout and (colour, shape) in HELDOUT:
            shape = SHAPES[(sh[i] + 1) % len(SHAPES)]
        b = COLOUR_NAMES[bg[i] + (1 if bg[i] >= co[i] else 0)]  # any colour except the object's
        if extra and extra[i][0] < hard_pairs:
            b = NEAREST[colour][int(extra[i][1] * 3) % 3]
        a = dict(shape=shape, colour=colour, pos=POSITIONS[po[i]], size=SIZES[si[i]], bg=b)
        attrs.append(a)
        if extra and extra[i][2] < phrasings:
            t = PHRASINGS[int(extra[i][3] * len(PHRASINGS)) % len(PHRASINGS)]
            caps.append(phrase(t, a["size"], colour, shape, a["pos"], b))
        else:
            caps.append(caption(a["size"], colour, shape, a["pos"], b, drops[i][0] < 0.15, drops[i][1] < 0.15,
                                drops[i][2] < 0.15, drops[i][3] < 0.5))
    return attrs, caps


def render(attrs, size, device, gen, return_alpha=False):
    """Draw the shapes: attrs (list of dicts) -> float [B, 3, size, size] in [-1, 1] (and, with return_alpha,
    the object's coverage [B, 1, size, size] in [0, 1]).
    gen (a torch.Generator on `device`) jitters position (+-0.04), radius (within the size range),
    rotation (star/triangle/square/cross: small, +-12 degrees) and colour (+-0.04 per channel)."""
    n = len(attrs)
    u = torch.rand((n, 8), generator=gen, device=device)
    cx = torch.tensor([POSITION_XY[a["pos"]][0] for a in attrs], device=device) + (u[:, 0] - 0.5) * 0.08
    cy = torch.tensor([POSITION_XY[a["pos"]][1] for a in attrs], device=device) + (u[:, 1] - 0.5) * 0.08
    lo = torch.tensor([SIZE_RADIUS[a["size"]][0] for a in attrs], device=device)
    hi = torch.tensor([SIZE_RADIUS[a["size"]][1] for a in attrs], device=device)
    rad = lo + (hi - lo) * u[:, 2]
    rot = (u[:, 3] - 0.5) * (24.0 * math.pi / 180.0)
    fg = torch.tensor([COLOURS[a["colour"]] for a in attrs], device=device) + (u[:, 4:5] - 0.5) * 0.08
    bgc = torch.tensor([COLOURS[a["bg"]] for a in attrs], device=device) + (u[:, 5:6] - 0.5) * 0.08
    fg, bgc = fg.clamp(0, 1), bgc.clamp(0, 1)

    coords = (torch.arange(size, device=device, dtype=torch.float32) + 0.5) / size
    yy, xx = torch.meshgrid(coords, coords, indexing="ij")
    dx = xx[None] - cx[:, None, None]
    dy = -(yy[None] - cy[:, None, None])  # y up
    c, s = torch.cos(rot)[:, None, None], torch.sin(rot)[:, None, None]
    rx, ry = c * dx + s * dy, -s * dx + c * dy
    R = rad[:, None, None]
    r = torch.sqrt(rx * rx + ry * ry)
    theta = torch.atan2(ry, rx)
    sd = torch.empty_like(r)
    kinds = [a["shape"] for a in attrs]
    for k in set(kinds):
        m = torch.tensor([kk == k for kk in kinds], device=device)
        if k == "circle":
            d = r - R
        elif k == "ring":
            d = (r - 0.72 * R).abs() - 0.28 * R
        elif k == "square":
            d = torch.maximum(rx.abs(), ry.abs()) - 0.78 * R
        elif k == "cross":
            w = 0.3 * R
            d = torch.minimum(torch.maximum(rx.abs() - R, ry.abs() - w), torch.maximum(rx.abs() - w, ry.abs() - R))
        elif k == "triangle":  # equilateral, pointing up, circumradius 1.1 R
            d = None
            for ang in (-90.0, 30.0, 150.0):
                a = ang * math.pi / 180.0
                e = rx * math.cos(a) + ry * math.sin(a)
                d = e if d is None else torch.maximum(d, e)
            d = d - 0.55 * R
        elif k == "star":  # five points, one pointing up; radius between 0.45 R and 1.1 R
            ph = torch.remainder(theta - math.pi / 2, 2 * math.pi / 5) / (2 * math.pi / 5)
            tri = (2 * ph - 1).abs()  # 1 at the points, 0 between them
            d = (r - R * (0.45 + 0.65 * tri)) * 0.7
        else:
            raise ValueError(k)
        sd[m] = d[m]
    aa = 1.0 / size
    alpha = (0.5 - sd / aa).clamp(0, 1)[:, None]
    img = alpha * fg[:, :, None, None] + (1 - alpha) * bgc[:, :, None, None]
    return (img * 2 - 1, alpha) if return_alpha else img * 2 - 1


def batch(n, size, device, cpu_gen, dev_gen, allow_heldout=False, phrasings=0.0, hard_pairs=0.0, return_alpha=False):
    """One training batch: (images [n, 3, size, size] in [-1, 1], captions list[str], attrs), and the object
    coverage [n, 1, size, size] last with return_alpha."""
    attrs, caps = sample_attributes(n, cpu_gen, allow_heldout, phrasings, hard_pairs)
    if return_alpha:
        img, alpha = render(attrs, size, device, dev_gen, return_alpha=True)
        return img, caps, attrs, alpha
    return render(attrs, size, device, dev_gen), caps, attrs
