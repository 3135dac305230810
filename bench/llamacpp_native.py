#!/usr/bin/python3
"""llamacpp_native.py — run a llama-bench binary built from source (where
node is absent, e.g. the H200 host; bench/llama_1b.sh with LLAMA_BENCH=PATH)
and print its pp/tg figures in the JSON shape of bench/llamacpp_bench.mjs
(engine, llama_cpp_release, build_type, cpu_variant, threads,
flash_attention, results: [{test, n_tokens, threads, avg_ts, stddev_ts,
samples_ts}]), so llama_1b.sh reports either the same way.

usage: llamacpp_native.py LLAMA_BENCH MODEL.gguf THREADS PP TG REPS
llama-bench runs with -o json (its own warm-up run, then REPS runs per test;
-fa auto as its default; mmap on). Exit 1 with llama-bench's stderr when it
fails.
"""
import json
import subprocess
import sys


def main():
    if len(sys.argv) != 7:
        sys.exit(__doc__.split("\n\n")[1])
    exe, model, threads, pp, tg, reps = sys.argv[1:]
    cmd = [exe, "-m", model, "-t", threads, "-p", pp, "-n", tg, "-r", reps, "-o", "json"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.stderr.write(p.stderr)
        sys.exit(1)
    rows = json.loads(p.stdout)
    results, info = [], {}
    for r in rows:
        test = f"pp{r['n_prompt']}" if r["n_gen"] == 0 else f"tg{r['n_gen']}"
        results.append({"test": test, "n_tokens": r["n_prompt"] or r["n_gen"], "threads": r["n_threads"],
                        "avg_ts": r["avg_ts"], "stddev_ts": r["stddev_ts"], "samples_ts": r["samples_ts"]})
        info = r
    out = {"engine": "llama.cpp", "node_llama_cpp": "-",
           "llama_cpp_release": f"{info.get('build_commit', '?')} (build {info.get('build_number', '?')})",
           "build_type": "llama-bench from source", "cpu_variant": info.get("backends", "CPU"),
           "system_info": info.get("cpu_info", ""), "threads": info.get("n_threads"),
           "flash_attention": info.get("flash_attn"), "results": results}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
