// The web page at / in headless Chromium (Debian's chromium, puppeteer-core): submit a prompt,
// watch the progress bar advance with a live preview, see the image and its parameters, reuse
// them from the gallery, draw a mask on an uploaded image and in-paint, cancel a queued job, and
// the layout at phone width. Screenshots go to OUTDIR.
// Usage: node page.mjs URL OUTDIR PROFILE_DIR
import puppeteer from "puppeteer-core";
import fs from "node:fs";
import path from "node:path";
import { checks, sleep, call, pngInfo } from "./lib.mjs";

const [url, outdir, profile] = process.argv.slice(2);
fs.mkdirSync(outdir, { recursive: true });
const t = checks();
const browser = await puppeteer.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  headless: true,
  args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--user-data-dir=" + profile],
});
const shot = async (page, name) => page.screenshot({ path: path.join(outdir, name + ".png"), fullPage: true });
try {
  const page = await browser.newPage();
  const consoleErrors = [];
  page.on("pageerror", (e) => consoleErrors.push(String(e)));
  page.on("console", (m) => { if (m.type() === "error") consoleErrors.push(m.text()); });
  const external = [];
  page.on("request", (req) => { if (!req.url().startsWith(url) && !req.url().startsWith("data:") && !req.url().startsWith("blob:")) external.push(req.url()); });
  await page.setViewport({ width: 1280, height: 900 });
  await page.goto(url + "/", { waitUntil: "networkidle0" });
  await page.waitForFunction(() => document.querySelectorAll("#sampler option").length > 1, { timeout: 30000 });
  t.check("page: the model's name and the samplers are shown", await page.$eval("#model", (e) => e.textContent.includes("easel-demo-shapes")));

  // txt2img: submit, watch the progress bar
  await page.$eval("#prompt", (e) => { e.value = "a large red circle in the centre, blue background"; });
  await page.$eval("#width", (e) => { e.value = 64; });
  await page.$eval("#height", (e) => { e.value = 64; });
  await page.$eval("#steps", (e) => { e.value = 40; });
  await page.$eval("#seed", (e) => { e.value = 1; });
  await page.select("#sampler", "Euler");
  await page.click("#generate");
  const widths = new Set();
  let midShot = false, previewSeen = false;
  for (let i = 0; i < 1200; i++) {
    const s = await page.evaluate(() => ({ w: document.querySelector("#progress-bar").style.width, text: document.querySelector("#progress-text").textContent,
      preview: !document.querySelector("#preview").classList.contains("hidden") && document.querySelector("#preview").src.startsWith("data:image/png"),
      done: !document.querySelector("#result").classList.contains("hidden") }));
    if (s.w && s.w !== "0%") widths.add(s.w);
    if (s.preview) previewSeen = true;
    if (!midShot && widths.size >= 3 && /step \d+\/40/.test(s.text) && /ETA/.test(s.text)) { await shot(page, "1-progress"); midShot = true; }
    if (s.done) break;
    await sleep(25);
  }
  t.check("progress bar advances (several widths seen)", widths.size >= 3, [...widths].join(" "));
  t.check("progress text shows step/steps and ETA mid-job", midShot);
  t.check("a live preview is shown while sampling", previewSeen);
  await page.waitForFunction(() => !document.querySelector("#result").classList.contains("hidden") && document.querySelector("#params").textContent.includes("Steps: 40"), { timeout: 60000 });
  const params = await page.$eval("#params", (e) => e.textContent);
  t.check("the image and its parameters are shown", /Seed: 1/.test(params) && /Sampler: Euler/.test(params), params);
  const resultSrc = await page.$eval("#result", (e) => e.src);
  const png = Buffer.from(await (await fetch(resultSrc)).arrayBuffer());
  t.check("the shown image is the job's 64x64 PNG", pngInfo(png) && pngInfo(png).width === 64);
  await shot(page, "2-result");

  // the gallery keeps the parameters: clear the form, click the image, reuse
  await page.$eval("#prompt", (e) => { e.value = ""; });
  await page.$eval("#seed", (e) => { e.value = -1; });
  await page.click("#gallery img");
  await page.click("#reuse");
  t.check("gallery: reuse puts prompt and seed back", await page.evaluate(() => document.querySelector("#prompt").value.startsWith("a large red circle") &&
    document.querySelector("#seed").value === "1" && document.querySelector("#steps").value === "40"));

  // in-painting: upload the result, draw a mask, run
  const initFile = path.join(outdir, "init.png");
  fs.writeFileSync(initFile, png);
  await page.click('#mode-tabs button[data-mode="img2img"]');
  const input = await page.$("#init-file");
  await input.uploadFile(initFile);
  await page.waitForFunction(() => !document.querySelector("#canvas-wrap").classList.contains("hidden"), { timeout: 10000 });
  const box = await (await page.$("#mask-canvas")).boundingBox();
  await page.mouse.move(box.x + box.width * 0.3, box.y + box.height * 0.3);
  await page.mouse.down();
  await page.mouse.move(box.x + box.width * 0.7, box.y + box.height * 0.5, { steps: 8 });
  await page.mouse.move(box.x + box.width * 0.4, box.y + box.height * 0.7, { steps: 8 });
  await page.mouse.up();
  const painted = await page.evaluate(() => {
    const c = document.querySelector("#mask-canvas"), d = c.getContext("2d").getImageData(0, 0, c.width, c.height).data;
    let n = 0; for (let i = 3; i < d.length; i += 4) if (d[i] > 0) n++;
    return n / (c.width * c.height);
  });
  t.check("a mask is drawn on the image", painted > 0.02 && painted < 0.9, painted);
  await page.$eval("#prompt", (e) => { e.value = "a small green square on the left, white background"; });
  await page.$eval("#steps", (e) => { e.value = 6; });
  await shot(page, "3-mask");
  const before = await call(url, "GET", "/easel/v1/jobs?recent=1");
  await page.click("#generate");
  await page.waitForFunction((n) => document.querySelectorAll("#gallery img").length > n && document.querySelector("#params").textContent.includes("Denoising strength"),
    { timeout: 120000 }, 1);
  const jobs = (await call(url, "GET", "/easel/v1/jobs?recent=1")).body.jobs;
  const inpaint = jobs.find((j) => j.state === "done" && j.id !== (before.body.jobs[0] || {}).id);
  t.check("the in-painting job ran with the drawn mask", inpaint && inpaint.request.type === "img2img" && inpaint.inpainting === true, JSON.stringify(inpaint).slice(0, 300));
  await shot(page, "4-inpaint");

  // the queue: a long job running, one queued, cancel the queued one from the page
  await page.click('#mode-tabs button[data-mode="txt2img"]');
  await page.$eval("#steps", (e) => { e.value = 150; });
  await page.click("#generate");
  await sleep(300);
  await page.click("#generate");
  await page.waitForFunction(() => document.querySelectorAll("#queue .queue-item").length >= 2, { timeout: 30000 });
  await shot(page, "5-queue");
  const queued = await page.$$eval("#queue .queue-item", (rows) => rows.map((r) => r.querySelector("span").textContent));
  await page.evaluate(() => { const rows = [...document.querySelectorAll("#queue .queue-item")]; rows[rows.length - 1].querySelector(".cancel").click(); });
  await page.waitForFunction(() => document.querySelectorAll("#queue .queue-item").length <= 1, { timeout: 30000 });
  t.check("the queue lists running and queued jobs; cancel removes one", queued.length >= 2 && /running|queued/.test(queued[0]), queued.join(" | "));
  await page.evaluate(() => { const r = document.querySelector("#queue .queue-item .cancel"); if (r) r.click(); });

  // phone width
  await page.setViewport({ width: 390, height: 844, isMobile: true, hasTouch: true });
  await sleep(300);
  const overflow = await page.evaluate(() => document.documentElement.scrollWidth);
  await shot(page, "6-phone");
  t.check("phone width (390 px): no horizontal scrolling", overflow <= 391, overflow);
  t.check("the page loads nothing from elsewhere", external.length === 0, external.join(" "));
  t.check("no script errors", consoleErrors.length === 0, consoleErrors.join(" | "));
} catch (e) {
  t.check("page test ran", false, e.stack || e);
} finally {
  await browser.close();
}
t.done();
