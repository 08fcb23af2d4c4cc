// The official openai npm SDK against `easel server` (only baseURL changed): models.list,
// images.generate, images.edit with an image and an RGBA mask, its error class for a bad size,
// and a wrong API key. Usage: node openai.mjs URL API_KEY
import OpenAI, { toFile } from "openai";
import { checks, makePng, pngInfo, b64png } from "./lib.mjs";

const [url, key] = process.argv.slice(2);
const t = checks();
const client = new OpenAI({ baseURL: url + "/v1", apiKey: key, maxRetries: 0, timeout: 300000 });

const models = await client.models.list();
const ids = [];
for await (const m of models) ids.push(m.id);
t.check("models.list: the loaded model", ids.includes("easel-demo-shapes"), ids.join(","));

let r = await client.images.generate({ prompt: "a large yellow ring on the right, blue background", n: 1, size: "64x64", response_format: "b64_json" });
let png = b64png(r.data && r.data[0] && r.data[0].b64_json);
t.check("images.generate: data[0].b64_json is a 64x64 PNG", png && png.width === 64 && png.height === 64, JSON.stringify(r).slice(0, 200));
t.check("images.generate: created is a Unix time", typeof r.created === "number" && r.created > 1.6e9);
t.check("images.generate: the PNG carries A1111 parameters", png && /Steps: 2, Sampler: Euler/.test(png.text.parameters || ""), png && png.text.parameters);
r = await client.images.generate({ prompt: "a small red cross at the bottom", n: 2, size: "64x64" });
t.check("images.generate n=2: two images", r.data.length === 2 && r.data.every((d) => b64png(d.b64_json)), r.data.length);
r = await client.images.generate({ prompt: "a red cross", size: "64x64", response_format: "url" });
let fetched = r.data[0].url ? await fetch(r.data[0].url, { headers: { Authorization: "Bearer " + key } }) : null;
t.check("images.generate response_format url: the URL serves the PNG", fetched && fetched.status === 200 &&
  pngInfo(Buffer.from(await fetched.arrayBuffer())) !== null, r.data[0].url);

const image = Buffer.from((await client.images.generate({ prompt: "a large blue square on the left, pink background", size: "64x64" })).data[0].b64_json, "base64");
// OpenAI masks: transparent pixels are where to edit
const mask = makePng(64, 64, 4, (x, y) => (x >= 32 ? [0, 0, 0, 0] : [0, 0, 0, 255]));
r = await client.images.edit({
  image: await toFile(image, "image.png", { type: "image/png" }),
  mask: await toFile(mask, "mask.png", { type: "image/png" }),
  prompt: "a large white circle at the bottom, red background",
  size: "64x64",
});
png = b64png(r.data && r.data[0] && r.data[0].b64_json);
t.check("images.edit (image + RGBA mask): a 64x64 PNG", png && png.width === 64 && png.height === 64, JSON.stringify(r).slice(0, 200));
t.check("images.edit: an img2img infotext (Denoising strength)", png && /Denoising strength/.test(png.text.parameters || ""), png && png.text.parameters);
r = await client.images.edit({ image: await toFile(image, "image.png", { type: "image/png" }), prompt: "the same, at night" });
t.check("images.edit without a mask: the whole image", b64png(r.data[0].b64_json) !== null);

try {
  await client.images.generate({ prompt: "x", size: "huge" });
  t.check("a bad size throws BadRequestError", false, "no error");
} catch (e) {
  t.check("a bad size throws BadRequestError (400, param size)", e instanceof OpenAI.BadRequestError && e.status === 400 && e.param === "size", e.message);
}
try {
  await new OpenAI({ baseURL: url + "/v1", apiKey: "wrong", maxRetries: 0 }).images.generate({ prompt: "x", size: "64x64" });
  t.check("a wrong API key throws AuthenticationError", false, "no error");
} catch (e) {
  t.check("a wrong API key throws AuthenticationError (401)", e instanceof OpenAI.AuthenticationError && e.status === 401, e.message);
}
t.done();
