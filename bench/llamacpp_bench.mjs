// llamacpp_bench.mjs — llama.cpp's CPU throughput on a GGUF file, measured
// the way llama-bench measures it, through the prebuilt llama.cpp that the
// npm package node-llama-cpp ships (bench/llama_1b.sh LLAMACPP=1 installs it
// and runs this next to `cmf bench` on the same weights).
//
// Tests (llama-bench tools/llama-bench: test_prompt / test_gen):
//   pp: clear the KV cache, decode PP tokens (BOS then random ids) in one
//       llama_decode call (batch 512, so one ubatch for PP <= 512);
//   tg: clear the KV cache, decode BOS, then TG-1 more single tokens, each
//       the greedy choice of the previous step (TG decodes in all);
//   each test runs once as a warm-up (not counted; tg warms up with one
//   token, as llama-bench) and then REPS times; tok/s is tokens / wall time
//   of the decodes, mean ± sample standard deviation over the repetitions.
// Every decode is one call of node-llama-cpp's lowest-level sequence API
// (LlamaContextSequence.controlledEvaluate: the token array goes to
// llama_decode in one batch; greedy sampling is llama.cpp's sampler), so
// the JavaScript between decodes is one promise per token.
//
// Nothing is compiled or downloaded: getLlama is told build "never" and
// skipDownload, gpu false (the CPU backend; ggml picks its best CPU variant
// for this processor at load time, reported as cpu_variant).
//
// usage: node llamacpp_bench.mjs MODEL.gguf --npm DIR [-t N] [-p PP] [-n TG] [-r REPS]
//        node llamacpp_bench.mjs MODEL.gguf --npm DIR --logits ID,ID,...
//   --npm DIR   folder whose node_modules holds node-llama-cpp
//   --logits    instead of timing, print the logits of every position for the
//               given token ids as JSON (to check a GGUF against another engine)
// Prints one JSON object on stdout; llama.cpp's log goes to stderr.
import fs from "node:fs";
import path from "node:path";
import {pathToFileURL} from "node:url";

function parseArgs(argv) {
    const a = {threads: 0, pp: 128, tg: 64, reps: 3, npm: null, logits: null, model: null};
    for (let i = 0; i < argv.length; i++) {
        const k = argv[i], v = () => {
            if (i + 1 >= argv.length) throw new Error(`${k} needs a value`);
            return argv[++i];
        };
        if (k === "-t" || k === "--threads") a.threads = parseInt(v(), 10);
        else if (k === "-p" || k === "--pp") a.pp = parseInt(v(), 10);
        else if (k === "-n" || k === "--tg") a.tg = parseInt(v(), 10);
        else if (k === "-r" || k === "--reps") a.reps = parseInt(v(), 10);
        else if (k === "--npm") a.npm = v();
        else if (k === "--logits") a.logits = v().split(",").map((s) => parseInt(s, 10));
        else if (!a.model && !k.startsWith("-")) a.model = k;
        else throw new Error(`unknown argument ${k}`);
    }
    if (!a.model || !a.npm) throw new Error("usage: llamacpp_bench.mjs MODEL.gguf --npm DIR [-t N] [-p PP] [-n TG] [-r REPS]");
    for (const k of ["threads", "pp", "tg", "reps"])
        if (!(a[k] >= 0)) throw new Error(`bad value for ${k}`);
    return a;
}

// node-llama-cpp lives in DIR/node_modules, not next to this file, so its
// ESM entry point is imported by path.
async function importNodeLlamaCpp(dir) {
    const pkgDir = path.join(path.resolve(dir), "node_modules", "node-llama-cpp");
    const pkg = JSON.parse(fs.readFileSync(path.join(pkgDir, "package.json"), "utf8"));
    const exp = pkg.exports?.["."];
    const entry = (typeof exp === "string" ? exp : exp?.import ?? exp?.default) ?? pkg.main;
    const mod = await import(pathToFileURL(path.join(pkgDir, entry)).href);
    return {mod, version: pkg.version};
}

function stats(xs) {
    const n = xs.length, mean = xs.reduce((s, x) => s + x, 0) / n;
    const sd = n > 1 ? Math.sqrt(xs.reduce((s, x) => s + (x - mean) ** 2, 0) / (n - 1)) : 0;
    return {mean, sd};
}

// A small deterministic generator (xorshift32) for the prompt's token ids.
function rng(seed) {
    let s = seed >>> 0 || 1;
    return () => {
        s ^= s << 13; s >>>= 0;
        s ^= s >>> 17;
        s ^= s << 5; s >>>= 0;
        return s;
    };
}

async function main() {
    const a = parseArgs(process.argv.slice(2));
    const {mod, version} = await importNodeLlamaCpp(a.npm);
    let cpuVariant = null;
    const logger = (level, msg) => {
        const m = /loaded CPU backend from (\S+)/.exec(msg);
        if (m) cpuVariant = path.basename(m[1]).replace(/^libggml-cpu-|\.so$/g, "");
        if (level === "error" || level === "warn" || level === "fatal") process.stderr.write(`llama.cpp: ${msg}`);
    };
    const llama = await mod.getLlama({
        gpu: false, build: "never", skipDownload: true, usePrebuiltBinaries: true,
        progressLogs: false, logLevel: "log", logger, // "log": the CPU variant line
        maxThreads: a.threads || 0,
    });
    const model = await llama.loadModel({modelPath: a.model, gpuLayers: 0, useMmap: true});
    const threads = a.threads || llama.cpuMathCores;
    const context = await model.createContext({
        contextSize: Math.max(256, a.pp + a.tg + 8, a.logits ? a.logits.length + 8 : 0),
        batchSize: 512, sequences: 1, threads: {ideal: threads, min: threads},
        flashAttention: "auto", // llama-bench's default (-fa auto)
    });
    const seq = context.getSequence();
    const meta = model.fileInfo.metadata;
    const vocab = Number(meta?.[meta?.general?.architecture]?.vocab_size ??
                         meta?.tokenizer?.ggml?.tokens?.length ?? 32000);
    const bos = model.tokens.bos ?? 1;

    const info = {
        engine: "llama.cpp",
        node_llama_cpp: version,
        llama_cpp_release: llama.llamaCppRelease.release,
        build_type: llama.buildType,
        cpu_variant: cpuVariant,
        system_info: llama.systemInfo.trim(),
        threads: context.currentThreads ?? threads,
        model: path.basename(a.model),
        model_size: fs.statSync(a.model).size,
        flash_attention: context.flashAttention,
    };

    if (a.logits) {
        await seq.clearHistory();
        const input = a.logits.map((t) => [t, {generateNext: {logits: true}}]);
        const out = await seq.controlledEvaluate(input);
        const rows = out.map((o) => {
            const row = new Array(vocab).fill(null);
            for (const [tok, v] of o.next.logits) row[tok] = v;
            return row;
        });
        process.stdout.write(JSON.stringify({...info, tokens: a.logits, logits: rows}) + "\n");
        await llama.dispose();
        return;
    }

    const next = rng(1234);
    const prompt = () => [bos, ...Array.from({length: a.pp - 1}, () => next() % vocab)];
    const greedy = {generateNext: {token: true, options: {temperature: 0}}};

    async function runPP() {
        const toks = prompt();
        await seq.clearHistory();
        const t0 = performance.now();
        await seq.controlledEvaluate([...toks.slice(0, -1), [toks[toks.length - 1], greedy]]);
        return a.pp / ((performance.now() - t0) / 1e3);
    }
    async function runTG(n) {
        await seq.clearHistory();
        let tok = bos;
        const t0 = performance.now();
        for (let i = 0; i < n; i++) {
            const [o] = await seq.controlledEvaluate([[tok, greedy]]);
            tok = o?.next?.token ?? bos;
        }
        return n / ((performance.now() - t0) / 1e3);
    }

    const results = [];
    const record = (test, n, samples) => {
        const s = stats(samples);
        results.push({test, n_tokens: n, threads: info.threads, avg_ts: s.mean, stddev_ts: s.sd, samples_ts: samples});
    };
    if (a.pp > 0) {
        await runPP(); // warm-up
        const s = [];
        for (let r = 0; r < a.reps; r++) s.push(await runPP());
        record(`pp${a.pp}`, a.pp, s);
    }
    if (a.tg > 0) {
        await runTG(1); // warm-up
        const s = [];
        for (let r = 0; r < a.reps; r++) s.push(await runTG(a.tg));
        record(`tg${a.tg}`, a.tg, s);
    }
    process.stdout.write(JSON.stringify({...info, results}) + "\n");
    await llama.dispose();
}

main().catch((e) => {
    process.stderr.write(`llamacpp_bench: ${e?.stack ?? e}\n`);
    process.exit(1);
});
