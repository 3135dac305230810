#!/bin/bash
# test_interrupt.sh — `cmf convert` stopped by SIGINT, SIGTERM, SIGHUP
# (a closed terminal) or SIGKILL while it writes leaves nothing behind
# (issue 17, item 6), and so does `cmf compact` stopped by SIGINT, SIGTERM or
# SIGKILL (the writer's spool is unlinked once open): a ~500 MB synthetic
# Hugging Face checkpoint (Llama layout, f16 zeros; the safetensors file is
# sparse, so it costs neither time nor disk), the conversion is started in
# the background and, as soon as its spool file holds the first tensor,
# interrupted. It must exit non-zero (killed by the signal, as shells
# expect), say "interrupted" (but after SIGKILL), and leave no *.spool*.tmp / *.part*.tmp and
# no output file. Args: <cmf binary> <source dir> <build dir>.
set -u
CMF=$1; BUILD=$3
PY=/usr/bin/python3
[ -x "$PY" ] || { echo "SKIP: $PY absent"; exit 77; }
T=$(mktemp -d "$BUILD/tmp_interrupt.XXXXXX") || exit 1
trap 'rm -rf "$T"' EXIT
fail=0

# hidden 1024, 16 layers, 16/4 heads, FFN 4096, vocab 8192: 252 M f16 = 503 MB
"$PY" - "$T/hf" <<'EOF' || { echo "FAIL: generating the checkpoint"; exit 1; }
import json, os, struct, sys
out = sys.argv[1]
os.makedirs(out)
h, f, L, V, heads, kvh = 1024, 4096, 16, 8192, 16, 4
kv = kvh * (h // heads)
ts = [("model.embed_tokens.weight", (V, h))]
for i in range(L):
    p = "model.layers.%d." % i
    ts += [(p + "input_layernorm.weight", (h,)), (p + "self_attn.q_proj.weight", (h, h)),
           (p + "self_attn.k_proj.weight", (kv, h)), (p + "self_attn.v_proj.weight", (kv, h)),
           (p + "self_attn.o_proj.weight", (h, h)), (p + "post_attention_layernorm.weight", (h,)),
           (p + "mlp.gate_proj.weight", (f, h)), (p + "mlp.up_proj.weight", (f, h)),
           (p + "mlp.down_proj.weight", (h, f))]
ts += [("model.norm.weight", (h,)), ("lm_head.weight", (V, h))]
hdr, off = {}, 0
for name, shape in ts:
    n = 2
    for d in shape:
        n *= d
    hdr[name] = {"dtype": "F16", "shape": list(shape), "data_offsets": [off, off + n]}
    off += n
hj = json.dumps(hdr).encode()
hj += b" " * (-len(hj) % 8)
with open(os.path.join(out, "model.safetensors"), "wb") as fp:
    fp.write(struct.pack("<Q", len(hj)) + hj)
    fp.truncate(8 + len(hj) + off)  # sparse: reads as zeros
cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": h,
       "intermediate_size": f, "num_hidden_layers": L, "num_attention_heads": heads,
       "num_key_value_heads": kvh, "vocab_size": V, "max_position_embeddings": 2048,
       "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": False,
       "hidden_act": "silu", "bos_token_id": 1, "eos_token_id": 2}
with open(os.path.join(out, "config.json"), "w") as fp:
    json.dump(cfg, fp)
EOF

set -m # job control: a background job then keeps SIGINT (else the shell ignores it for the job)
# the input of the compacts: the checkpoint as f16 (503 MB: the compact is
# still copying when its spool file gets its first tensor)
"$CMF" convert "$T/hf" -o "$T/in.cmf" --quant f16 --no-progress >/dev/null 2>"$T/err.txt" ||
    { echo "FAIL: converting the compact's input"; cat "$T/err.txt"; exit 1; }
for run in convert:INT convert:TERM convert:HUP convert:KILL compact:INT compact:TERM compact:KILL; do
    cmd=${run%:*}; sig=${run#*:}
    # On a loaded machine the poll below can miss the window (the process
    # writes its whole output between two looks): then it is run again, up
    # to three times, from a clean folder.
    for attempt in 1 2 3; do
    rm -f "$T"/out* "$T/err.txt"
    if [ "$cmd" = convert ]; then
        "$CMF" convert "$T/hf" -o "$T/out.cmf" --quant q8 --no-progress 2>"$T/err.txt" &
    else
        "$CMF" compact "$T/in.cmf" -o "$T/out.cmf" 2>"$T/err.txt" >/dev/null &
    fi
    pid=$!
    spool=
    for _ in $(seq 3000); do # 30 s at most; the first tensor takes well under a second
        # the spool is unlinked once open: find it among the process's files
        for fd in /proc/"$pid"/fd/*; do
            case $(readlink "$fd" 2>/dev/null) in
            *out.cmf.spool*.tmp*) [ "$(stat -L -c %s "$fd" 2>/dev/null || echo 0)" -gt 0 ] && spool=$fd ;;
            esac
        done
        [ -n "$spool" ] && break
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.01
    done
    [ -n "$spool" ] && break
    alive=0; kill -0 "$pid" 2>/dev/null && alive=1
    kill -KILL "$pid" 2>/dev/null
    wait "$pid"
    [ "$alive" = 1 ] && break # still running after 30 s without a spool: a real failure
    echo "note: $cmd SIG$sig attempt $attempt: finished before its spool was seen; again"
    done
    if [ -z "$spool" ]; then
        echo "FAIL: $cmd SIG$sig: no spool file with data appeared"; cat "$T/err.txt"; fail=1
        rm -f "$T"/out* "$T/err.txt"
        continue
    fi
    kill -"$sig" "$pid"
    wait "$pid"; rc=$?
    [ "$rc" -ne 0 ] || { echo "FAIL: $cmd SIG$sig: exit 0"; fail=1; }
    [ "$sig" = KILL ] || grep -q "interrupted" "$T/err.txt" ||
        { echo "FAIL: $cmd SIG$sig: no 'interrupted' message"; cat "$T/err.txt"; fail=1; }
    left=$(find "$T" -maxdepth 1 -name '*.tmp' -o -maxdepth 1 -name 'out*.cmf')
    [ -z "$left" ] || { echo "FAIL: $cmd SIG$sig: left behind: $left"; fail=1; }
    echo "$cmd SIG$sig: exit $rc, $(cat "$T/err.txt")"
    rm -f "$T"/out* "$T/err.txt"
done
exit $fail
