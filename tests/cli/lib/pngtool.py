#!/usr/bin/env python3
"""Small PNG / JPEG helper for the command tests (no PIL on the test machines).

  pngtool.py make FILE W H KIND   writes an 8-bit RGB PNG: KIND "gradient" (R = x, G = y, B = 128,
                                  scaled to 0..255) or "mask" (white left half, black right half)
  pngtool.py size FILE            prints "W H" of a PNG (IHDR) or a JPEG (first SOFn)
  pngtool.py text FILE KEY        prints the PNG tEXt/iTXt value of KEY, or the JPEG COM text
                                  (KEY ignored); exit 1 when absent
  pngtool.py format FILE          prints png or jpeg (by the file's signature), else exit 1
  pngtool.py diff FILE1 FILE2     two 8-bit RGB/RGBA PNGs of one size: prints "max N over K" (the
                                  largest channel difference, and how many channels differ by more
                                  than 2); exit 1 when the sizes or formats differ
"""
import struct
import sys
import zlib


def chunk(kind, data):
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def make(path, w, h, kind):
    rows = []
    for y in range(h):
        row = bytearray([0])
        for x in range(w):
            if kind == "mask":
                v = 255 if x < w // 2 else 0
                row += bytes([v, v, v])
            else:
                row += bytes([x * 255 // max(w - 1, 1), y * 255 // max(h - 1, 1), 128])
        rows.append(bytes(row))
    ihdr = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)
    data = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"".join(rows))) + chunk(b"IEND", b"")
    open(path, "wb").write(data)


def png_chunks(b):
    i = 8
    while i + 8 <= len(b):
        n = struct.unpack(">I", b[i:i + 4])[0]
        yield b[i + 4:i + 8], b[i + 8:i + 8 + n]
        i += 12 + n


def png_pixels(b):
    """(w, h, channels, bytes) of an 8-bit non-interlaced RGB / RGBA PNG, unfiltered (PNG spec 9.2)."""
    w, h, depth, ctype, _, _, interlace = struct.unpack(">IIBBBBB", b[16:29])
    ch = {2: 3, 6: 4}.get(ctype)
    if depth != 8 or ch is None or interlace:
        raise ValueError("not an 8-bit non-interlaced RGB/RGBA PNG")
    raw = zlib.decompress(b"".join(d for k, d in png_chunks(b) if k == b"IDAT"))
    stride = w * ch
    out = bytearray(h * stride)
    prev = bytearray(stride)
    for y in range(h):
        f = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - ch] if i >= ch else 0
            up = prev[i]
            c = prev[i - ch] if i >= ch else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + up) & 255
            elif f == 3:
                line[i] = (line[i] + (a + up) // 2) & 255
            elif f == 4:
                pa, pb, pc = abs(up - c), abs(a - c), abs(a + up - 2 * c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else up if pb <= pc else c)) & 255
        out[y * stride:(y + 1) * stride] = line
        prev = line
    return w, h, ch, bytes(out)


def jpeg_segments(b):
    i = 2
    while i + 4 <= len(b) and b[i] == 0xFF:
        marker = b[i + 1]
        n = struct.unpack(">H", b[i + 2:i + 4])[0]
        yield marker, b[i + 4:i + 2 + n]
        if marker == 0xDA:
            return
        i += 2 + n


def main():
    cmd, path = sys.argv[1], sys.argv[2]
    if cmd == "make":
        make(path, int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
        return 0
    b = open(path, "rb").read()
    if cmd == "diff":
        p1, p2 = png_pixels(b), png_pixels(open(sys.argv[3], "rb").read())
        if p1[:3] != p2[:3]:
            print(f"sizes differ: {p1[:3]} vs {p2[:3]}")
            return 1
        d = [abs(x - y) for x, y in zip(p1[3], p2[3])]
        print(f"max {max(d)} over {sum(1 for v in d if v > 2)}")
        return 0
    fmt = "png" if b.startswith(b"\x89PNG") else "jpeg" if b.startswith(b"\xff\xd8") else None
    if cmd == "format":
        if not fmt:
            return 1
        print(fmt)
        return 0
    if cmd == "size":
        if fmt == "png":
            w, h = struct.unpack(">II", b[16:24])
            print(w, h)
            return 0
        for marker, seg in jpeg_segments(b):
            if marker in (0xC0, 0xC1, 0xC2):
                h, w = struct.unpack(">HH", seg[1:5])
                print(w, h)
                return 0
        return 1
    if cmd == "text":
        key = sys.argv[3].encode()
        if fmt == "png":
            for kind, data in png_chunks(b):
                if kind == b"tEXt" and data.split(b"\0", 1)[0] == key:
                    print(data.split(b"\0", 1)[1].decode("latin-1"))
                    return 0
                if kind == b"iTXt" and data.split(b"\0", 1)[0] == key:
                    rest = data.split(b"\0", 1)[1][2:]  # compression flag and method
                    rest = rest.split(b"\0", 2)[2]      # language tag, translated keyword
                    print(rest.decode("utf-8"))
                    return 0
            return 1
        for marker, seg in jpeg_segments(b):
            if marker == 0xFE:
                print(seg.decode("utf-8"))
                return 0
        return 1
    return 2


if __name__ == "__main__":
    sys.exit(main())
