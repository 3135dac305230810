// serve_load.mjs — load benchmark of `cmf serve` (issue 21), with the
// metrics of vLLM's benchmarks/benchmark_serving.py:
//   TTFT  time from sending a request to its first streamed token;
//   ITL   the gaps between consecutive streamed tokens of a request (all
//         gaps of all requests pooled);
//   TPOT  per request (E2EL - TTFT) / (output tokens - 1);
//   E2EL  time from sending a request to its last byte;
//   output tok/s  all output tokens / the level's wall time.
// Requests arrive as a Poisson process (--rate R per second, exponential
// gaps from a seeded generator; inf = all at once, as vLLM's default) and
// at most C run at once (vLLM's --max-concurrency), for each C of
// --concurrency (default 1,4,16,64). Each request: a random prompt of
// --input tokens (ids, so every level costs the same), --output tokens out
// (ignore_eos), streamed with include_usage. The baseline is C = 1,
// measured in the same run: ratios of aggregate tok/s and of p99 ITL to it
// are printed (issue 21's targets: tok/s at 16 >= 4x, p99 ITL at 16 < 3x).
//
//
// llama.cpp's batched decoding in the same run (--gguf F --npm DIR): the
// same workload (same prompts, arrivals, concurrency levels, output length,
// temperature 0.8) through node-llama-cpp's prebuilt llama.cpp, one context
// of C sequences per level (its batch dispatcher puts the pending tokens of
// all sequences into one llama_decode per cycle, llama-server's -np C), CPU
// only, the threads of --threads. A token's time is when its evaluation
// promise resolves (node-llama-cpp samples inside the native call), so the
// metrics are the same as cmf's without HTTP/SSE. The ratios cmf/llama.cpp
// of aggregate tok/s and p99 ITL are printed per level. Install:
//   mkdir -p bench/.node && cd bench/.node && echo '{"private":true}' > package.json &&
//   NODE_LLAMA_CPP_SKIP_DOWNLOAD=true npm install --omit=optional --ignore-scripts \
//     node-llama-cpp@3.22.1 @node-llama-cpp/linux-x64@3.22.1
// (bench/.node is git-ignored; never in CI). The GGUF of the same weights:
// bench/gguf_write.py HF_DIR F.gguf --type q8_0 (bench/llama_1b.sh makes
// HF_DIR and the q8 .cmf).
//
// usage: node bench/serve_load.mjs --cmf build/tools/cmf --model M.cmf
//          [--concurrency 1,4,16,64] [--requests N or N1,N2,... one per level (default max(8, 2C))]
//          [--input 32] [--output 32] [--rate inf] [--seed 1]
//          [--serve-args "-t 2"] [--json]
//          [--gguf M.gguf --npm bench/.node [--threads N]]
//        or --url http://127.0.0.1:8080 to measure a running server.
import { spawn } from "node:child_process";
import fs from "node:fs";
import http from "node:http";
import path from "node:path";
import { pathToFileURL } from "node:url";

function args(argv) {
  const a = { cmf: null, model: null, url: null, conc: [1, 4, 16, 64], requests: [], input: 32, output: 32,
              rate: Infinity, seed: 1, serveArgs: "", json: false, key: null, gguf: null, npm: null, threads: 0 };
  for (let i = 0; i < argv.length; i++) {
    const k = argv[i], v = () => argv[++i];
    if (k === "--cmf") a.cmf = v();
    else if (k === "--model") a.model = v();
    else if (k === "--url") a.url = v();
    else if (k === "--concurrency") a.conc = v().split(",").map(Number);
    else if (k === "--requests") a.requests = v().split(",").map(Number);
    else if (k === "--input") a.input = Number(v());
    else if (k === "--output") a.output = Number(v());
    else if (k === "--rate") { const r = v(); a.rate = r === "inf" ? Infinity : Number(r); }
    else if (k === "--seed") a.seed = Number(v());
    else if (k === "--serve-args") a.serveArgs = v();
    else if (k === "--api-key") a.key = v();
    else if (k === "--json") a.json = true;
    else if (k === "--gguf") a.gguf = v();
    else if (k === "--npm") a.npm = v();
    else if (k === "--threads") a.threads = Number(v());
    else throw new Error("unknown argument " + k);
  }
  if (!a.url && (!a.cmf || !a.model)) throw new Error("need --cmf and --model, or --url");
  if (!!a.gguf !== !!a.npm) throw new Error("--gguf and --npm go together");
  if (a.requests.some((n) => !(n >= 1)) || (a.requests.length > 1 && a.requests.length !== a.conc.length))
    throw new Error("--requests: one count >= 1, or one per --concurrency level");
  return a;
}

function rng(seed) {
  let s = seed >>> 0 || 1;
  return () => ((s = (s * 1664525 + 1013904223) >>> 0) / 4294967296);
}

function post(base, path, body, key, onData) {
  return new Promise((resolve, reject) => {
    const u = new URL(path, base);
    const h = { "Content-Type": "application/json" };
    if (key) h.Authorization = "Bearer " + key;
    const r = http.request({ host: u.hostname, port: u.port, path: u.pathname, method: "POST", headers: h, agent: false }, (res) => {
      let buf = "";
      res.on("data", (c) => { buf += c; if (onData) buf = onData(buf); });
      res.on("end", () => resolve({ status: res.statusCode, body: buf }));
    });
    r.on("error", reject);
    r.end(JSON.stringify(body));
  });
}

async function one(base, a, prompt) {
  const t0 = performance.now();
  const times = [];
  let usage = null, err = null;
  const res = await post(base, "/v1/completions", { prompt, max_tokens: a.output, ignore_eos: true, temperature: 0.8,
    seed: 1, stream: true, stream_options: { include_usage: true } }, a.key, (buf) => {
    let i;
    while ((i = buf.indexOf("\n\n")) >= 0) {
      const ev = buf.slice(0, i);
      buf = buf.slice(i + 2);
      if (!ev.startsWith("data: ") || ev === "data: [DONE]") continue;
      const j = JSON.parse(ev.slice(6));
      if (j.error) err = j.error.message;
      if (j.usage) usage = j.usage;
      if (j.choices && j.choices.some((c) => c.text)) times.push(performance.now());
    }
    return buf;
  });
  const t1 = performance.now();
  if (res.status !== 200 || err || !usage) throw new Error("request failed: " + res.status + " " + (err || res.body.slice(0, 200)));
  const n = usage.completion_tokens;
  const ttft = times[0] - t0, itl = times.slice(1).map((t, k) => t - times[k]);
  return { ttft, itl, tpot: n > 1 ? (t1 - t0 - ttft) / (n - 1) : 0, e2el: t1 - t0, n };
}

const pct = (xs, p) => {
  if (!xs.length) return NaN;
  const s = [...xs].sort((x, y) => x - y), k = (s.length - 1) * p / 100, lo = Math.floor(k), hi = Math.ceil(k);
  return s[lo] + (s[hi] - s[lo]) * (k - lo);
};

async function level(run1, a, c, nVocab) {
  const k = a.conc.indexOf(c), n = a.requests.length ? a.requests[a.requests.length > 1 ? k : 0] : Math.max(8, 2 * c);
  const r = rng(a.seed * 7919 + c);
  const prompts = Array.from({ length: n }, () => Array.from({ length: a.input }, () => 3 + Math.floor(r() * (nVocab - 3))));
  let at = 0;
  const arrivals = prompts.map(() => (at += isFinite(a.rate) ? -Math.log(1 - r()) / a.rate * 1000 : 0));
  const t0 = performance.now(), results = [];
  let next = 0, running = 0;
  await new Promise((resolve, reject) => {
    const launch = () => {
      while (running < c && next < n && performance.now() - t0 >= arrivals[next]) {
        const i = next++;
        running++;
        run1(prompts[i]).then((x) => { results.push(x); running--; if (results.length === n) resolve(); else launch(); }, reject);
      }
      if (next < n && running < c) setTimeout(launch, Math.max(0, arrivals[next] - (performance.now() - t0)));
    };
    launch();
  });
  const wall = (performance.now() - t0) / 1000, tokens = results.reduce((s, x) => s + x.n, 0);
  const itl = results.flatMap((x) => x.itl), ttft = results.map((x) => x.ttft), tpot = results.map((x) => x.tpot), e2el = results.map((x) => x.e2el);
  return { concurrency: c, requests: n, wall_s: wall, output_tokens: tokens, output_tok_s: tokens / wall,
           ttft_ms: { p50: pct(ttft, 50), p99: pct(ttft, 99) }, itl_ms: { p50: pct(itl, 50), p99: pct(itl, 99) },
           tpot_ms: { p50: pct(tpot, 50), p99: pct(tpot, 99) }, e2el_ms: { p50: pct(e2el, 50), p99: pct(e2el, 99) } };
}

function line(who, r, b) {
  return `${who} C=${String(r.concurrency).padStart(3)}  ${r.requests} req  ${r.output_tok_s.toFixed(2)} tok/s (x${(r.output_tok_s / b.output_tok_s).toFixed(2)})` +
    `  TTFT p50/p99 ${r.ttft_ms.p50.toFixed(0)}/${r.ttft_ms.p99.toFixed(0)} ms  ITL p50/p99 ${r.itl_ms.p50.toFixed(1)}/${r.itl_ms.p99.toFixed(1)} ms` +
    ` (p99 x${(r.itl_ms.p99 / b.itl_ms.p99).toFixed(2)})  TPOT p50/p99 ${r.tpot_ms.p50.toFixed(1)}/${r.tpot_ms.p99.toFixed(1)} ms` +
    `  E2EL p50/p99 ${r.e2el_ms.p50.toFixed(0)}/${r.e2el_ms.p99.toFixed(0)} ms`;
}

// llama.cpp: every level of --concurrency with one context of C sequences.
async function llamaLevels(a, nVocab) {
  const pkgDir = path.join(path.resolve(a.npm), "node_modules", "node-llama-cpp");
  const pkg = JSON.parse(fs.readFileSync(path.join(pkgDir, "package.json"), "utf8"));
  const exp = pkg.exports?.["."];
  const entry = (typeof exp === "string" ? exp : exp?.import ?? exp?.default) ?? pkg.main;
  const mod = await import(pathToFileURL(path.join(pkgDir, entry)).href);
  const llama = await mod.getLlama({ gpu: false, build: "never", skipDownload: true, usePrebuiltBinaries: true,
    progressLogs: false, logLevel: "warn", maxThreads: a.threads || 0 });
  const model = await llama.loadModel({ modelPath: a.gguf, gpuLayers: 0, useMmap: true });
  const threads = a.threads || llama.cpuMathCores;
  const levels = [];
  for (const c of a.conc) {
    const ctx = await model.createContext({ contextSize: c * (a.input + a.output + 16), sequences: c, batchSize: 512,
      threads: { ideal: threads, min: threads }, flashAttention: "auto" });
    const free = Array.from({ length: c }, () => ctx.getSequence());
    const opts = { generateNext: { token: true, options: { temperature: 0.8, topK: 40, topP: 0.95, minP: 0.05, seed: 1 } } };
    const run1 = async (prompt) => {
      const seq = free.pop();
      const t0 = performance.now(), times = [];
      try {
        await seq.clearHistory();
        let [o] = (await seq.controlledEvaluate([...prompt.slice(0, -1), [prompt[prompt.length - 1], opts]])).slice(-1);
        times.push(performance.now());
        for (let k = 1; k < a.output; k++) {
          [o] = await seq.controlledEvaluate([[o?.next?.token ?? 5, opts]]);
          times.push(performance.now());
        }
      } finally { free.push(seq); }
      const t1 = times[times.length - 1], ttft = times[0] - t0, n = times.length;
      return { ttft, itl: times.slice(1).map((t, k) => t - times[k]), tpot: n > 1 ? (t1 - t0 - ttft) / (n - 1) : 0, e2el: t1 - t0, n };
    };
    if (levels.length === 0) await run1([5, 6, 7]); // warm-up
    levels.push(await level(run1, a, c, nVocab));
    await ctx.dispose();
  }
  const info = { node_llama_cpp: pkg.version, llama_cpp_release: llama.llamaCppRelease.release, threads, gguf: path.basename(a.gguf), levels };
  await llama.dispose();
  return info;
}

const a = args(process.argv.slice(2));
let base = a.url, proc = null;
if (!base) {
  const max = Math.max(...a.conc);
  const sa = ["serve", a.model, "--port", "0", "-np", String(max), "--queue", String(4 * max), ...a.serveArgs.split(" ").filter(Boolean)];
  proc = spawn(a.cmf, sa, { stdio: ["ignore", "ignore", "pipe"] });
  base = await new Promise((resolve, reject) => {
    let log = "";
    proc.stderr.on("data", (d) => {
      log += d;
      const m = /listening on (http:\/\/[^ ]+)/.exec(log);
      if (m && /ready:/.test(log)) resolve(m[1]);
    });
    proc.on("exit", (code) => reject(new Error("cmf serve exited " + code + ": " + log)));
  });
}
const models = await new Promise((resolve, reject) => {
  http.get(new URL("/v1/models", base), { headers: a.key ? { Authorization: "Bearer " + a.key } : {} }, (res) => {
    let b = "";
    res.on("data", (c) => (b += c));
    res.on("end", () => resolve(JSON.parse(b)));
  }).on("error", reject);
});
const nVocab = 1000; // random ids below 1000 exist in every vocabulary cmf serves
const out = [];
try {
  await one(base, a, [5, 6, 7]); // warm-up (page-in of the weights)
  for (const c of a.conc) {
    const r = await level((p) => one(base, a, p), a, c, nVocab);
    out.push(r);
    if (!a.json) console.log(line("cmf      ", r, out[0]));
  }
} finally {
  if (proc) proc.kill("SIGTERM");
}
const ll = a.gguf ? await llamaLevels(a, nVocab) : null;
if (ll && !a.json)
  out.forEach((r, k) => console.log(line("llama.cpp", ll.levels[k], ll.levels[0]) +
    `\n  cmf/llama.cpp at C=${r.concurrency}: tok/s x${(r.output_tok_s / ll.levels[k].output_tok_s).toFixed(2)}, ` +
    `p99 ITL x${(r.itl_ms.p99 / ll.levels[k].itl_ms.p99).toFixed(2)}`));
const b = out[0];
const summary = { model: models.data[0].id, input: a.input, output: a.output, rate: isFinite(a.rate) ? a.rate : "inf", levels: out,
  ratios_to_c1: out.map((r) => ({ concurrency: r.concurrency, tok_s: r.output_tok_s / b.output_tok_s, itl_p99: r.itl_ms.p99 / b.itl_ms.p99 })),
  llama_cpp: ll, ratios_to_llama_cpp: ll ? out.map((r, k) => ({ concurrency: r.concurrency,
    tok_s: r.output_tok_s / ll.levels[k].output_tok_s, itl_p99: r.itl_ms.p99 / ll.levels[k].itl_ms.p99 })) : null };
if (a.json) console.log(JSON.stringify(summary, null, 1));
