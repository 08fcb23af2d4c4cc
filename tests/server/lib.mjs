// Helpers of the server's client tests (tests/cli/server_*.sh run them with node).
import zlib from "node:zlib";

/// Counts checks; `done()` prints "N passed, N failed" and sets the exit code.
export function checks() {
  let passed = 0, failed = 0;
  return {
    check(name, ok, detail = "") {
      if (ok) { passed++; console.log("ok   " + name); }
      else { failed++; console.log("FAIL " + name + (detail ? ": " + String(detail).slice(0, 400) : "")); }
      return ok;
    },
    done() {
      console.log(`${passed} passed, ${failed} failed`);
      process.exitCode = failed ? 1 : 0;
    },
    get failed() { return failed; },
  };
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/// fetch + JSON: {status, headers, body (parsed JSON or text)}.
export async function call(base, method, path, body, headers = {}) {
  const opts = { method, headers: Object.assign({}, headers) };
  if (body !== undefined) {
    if (typeof body === "string" || body instanceof Uint8Array || body instanceof FormData) opts.body = body;
    else { opts.body = JSON.stringify(body); opts.headers["Content-Type"] = "application/json"; }
  }
  const r = await fetch(base + path, opts);
  const text = await r.text();
  let parsed = text;
  try { parsed = JSON.parse(text); } catch (e) { /* not JSON */ }
  return { status: r.status, headers: r.headers, body: parsed, text };
}

const CRC = (() => {
  const t = new Uint32Array(256);
  for (let n = 0; n < 256; n++) { let c = n; for (let k = 0; k < 8; k++) c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1; t[n] = c >>> 0; }
  return t;
})();
function crc32(buf) { let c = 0xffffffff; for (const b of buf) c = CRC[(c ^ b) & 0xff] ^ (c >>> 8); return (c ^ 0xffffffff) >>> 0; }
function chunk(type, data) {
  const out = Buffer.alloc(12 + data.length);
  out.writeUInt32BE(data.length, 0);
  out.write(type, 4, "latin1");
  data.copy(out, 8);
  out.writeUInt32BE(crc32(out.subarray(4, 8 + data.length)), 8 + data.length);
  return out;
}
/// An 8-bit PNG (channels 1 grey, 3 RGB, 4 RGBA) whose pixel (x, y) is px(x, y) -> array of channel values.
export function makePng(w, h, channels, px) {
  const colorType = { 1: 0, 3: 2, 4: 6 }[channels];
  const ihdr = Buffer.alloc(13);
  ihdr.writeUInt32BE(w, 0); ihdr.writeUInt32BE(h, 4); ihdr[8] = 8; ihdr[9] = colorType;
  const raw = Buffer.alloc((w * channels + 1) * h);
  for (let y = 0; y < h; y++) {
    raw[y * (w * channels + 1)] = 0;
    for (let x = 0; x < w; x++) {
      const v = px(x, y);
      for (let c = 0; c < channels; c++) raw[y * (w * channels + 1) + 1 + x * channels + c] = v[c];
    }
  }
  return Buffer.concat([Buffer.from([137, 80, 78, 71, 13, 10, 26, 10]), chunk("IHDR", ihdr), chunk("IDAT", zlib.deflateSync(raw)), chunk("IEND", Buffer.alloc(0))]);
}

/// {width, height, text: {keyword: text}} of a PNG buffer; null when it is not a PNG.
export function pngInfo(buf) {
  if (!buf || buf.length < 33 || buf.toString("latin1", 1, 4) !== "PNG") return null;
  const info = { width: buf.readUInt32BE(16), height: buf.readUInt32BE(20), text: {} };
  let off = 8;
  while (off + 8 <= buf.length) {
    const len = buf.readUInt32BE(off), type = buf.toString("latin1", off + 4, off + 8);
    const data = buf.subarray(off + 8, off + 8 + len);
    if (type === "tEXt") {
      const z = data.indexOf(0);
      info.text[data.toString("latin1", 0, z)] = data.toString("latin1", z + 1);
    } else if (type === "iTXt") {
      const z = data.indexOf(0);
      const key = data.toString("latin1", 0, z);
      let p = z + 3;  // compression flag, method
      p = data.indexOf(0, p) + 1;  // language tag
      p = data.indexOf(0, p) + 1;  // translated keyword
      info.text[key] = data.toString("utf8", p);
    }
    off += 12 + len;
  }
  return info;
}

export function b64png(s) {
  if (typeof s !== "string") return null;
  return pngInfo(Buffer.from(s.replace(/^data:image\/png;base64,/, ""), "base64"));
}
