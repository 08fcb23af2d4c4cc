#!/usr/bin/env python3
"""Small PNG / JPEG helper for the command tests (no PIL on the test machines).

  pngtool.py make FILE W H KIND   writes an 8-bit RGB PNG: KIND "gradient" (R = x, G = y, B = 128,
                                  scaled to 0..255) or "mask" (white left half, black right half)
  pngtool.py size FILE            prints "W H" of a PNG (IHDR) or a JPEG (first SOFn)
  pngtool.py text FILE KEY        prints the PNG tEXt/iTXt value of KEY, or the JPEG COM text
                                  (KEY ignored); exit 1 when absent
  pngtool.py format FILE          prints png or jpeg (by the file's signature), else exit 1
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
