// A small client of easel's jobs API for the shell tests:
//   node client.mjs URL submit JSON [JSON..] -> prints the job id (one line per body)
//   node client.mjs URL state ID             -> prints "state step"
//   node client.mjs URL wait ID [SECONDS]    -> waits until the job ends; prints its state
//   node client.mjs URL wait-step ID N       -> waits until the running job passed step N; prints the step
//   node client.mjs URL image ID INDEX FILE  -> writes the PNG
import fs from "node:fs";
const [url, cmd, ...args] = process.argv.slice(2);
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const job = async (id) => (await fetch(`${url}/easel/v1/jobs/${id}?images=false`)).json();
try {
  if (cmd === "submit") {
    // several bodies: submitted back to back from one process (one id per line), so a second job is
    // queued before the first can reach a step a test stops the server at
    for (const body of args) {
      const r = await fetch(url + "/easel/v1/jobs", { method: "POST", headers: { "Content-Type": "application/json" }, body });
      const j = await r.json();
      if (r.status !== 202) { console.error(JSON.stringify(j)); process.exit(1); }
      console.log(j.id);
    }
  } else if (cmd === "state") {
    const j = await job(args[0]);
    console.log(j.state, j.step);
  } else if (cmd === "wait") {
    const until = Date.now() + 1000 * Number(args[1] || 300);
    for (;;) {
      const j = await job(args[0]);
      if (["done", "failed", "cancelled"].includes(j.state) || Date.now() > until) { console.log(j.state + (j.error ? ": " + j.error : "")); break; }
      await sleep(100);
    }
  } else if (cmd === "wait-step") {
    for (let i = 0; i < 6000; i++) {
      const j = await job(args[0]);
      if (j.state === "running" && j.step >= Number(args[1])) { console.log(j.step); process.exit(0); }
      if (["done", "failed", "cancelled"].includes(j.state)) { console.log("ended: " + j.state); process.exit(1); }
      await sleep(10);
    }
    process.exit(1);
  } else if (cmd === "image") {
    const r = await fetch(`${url}/easel/v1/jobs/${args[0]}/images/${args[1]}`);
    if (r.status !== 200) { console.error(r.status, await r.text()); process.exit(1); }
    fs.writeFileSync(args[2], Buffer.from(await r.arrayBuffer()));
  } else {
    console.error("unknown command " + cmd);
    process.exit(2);
  }
} catch (e) {
  console.error(String(e));
  process.exit(1);
}
