#!/usr/bin/env bash
# test_cli.sh — drives `cmf info|verify|sign|keygen|compact` on a file
# written by cmf (tests/format/mkfile.c): verify passes on the clean file
# and fails naming the place after one flipped byte in a tensor, the header
# or the directory, and each problem is reported once (a truncated file, a
# directory); a non-zero envelope flags word fails; signatures are written
# and checked; compact round-trips; a shard set opens from any shard name
# and from the stem given to the writer; usage errors exit 2; `run
# --device cpu:t=N` (the demo model); a demo model with a norm tensor renamed
# is refused. Args: <cmf> <source dir> <build dir>.
set -u
CMF=$1
BUILD=$3
MK=$BUILD/cmf_format_mkfile
[ -x "$CMF" ] || { echo "SKIP: no cmf binary"; exit 77; }
[ -x "$MK" ] || { echo "SKIP: no $MK (build all targets)"; exit 77; }
T=$BUILD/tmp_format_cli
rm -rf "$T" && mkdir -p "$T"
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
# expect RC CMD...: run, capture output in $T/out
expect() {
    local want=$1; shift
    "$@" >"$T/out" 2>&1
    local rc=$?
    [ "$rc" = "$want" ] || { fail "exit $rc (want $want): $*"; sed 's/^/    /' "$T/out"; }
}
contains() { grep -qF -- "$1" "$T/out" || { fail "output lacks '$1'"; sed 's/^/    /' "$T/out"; }; }
# flip FILE OFFSET: xor the byte at OFFSET with 0x01
flip() {
    local b
    b=$(od -An -tu1 -j "$2" -N1 "$1" | tr -d ' ')
    printf "$(printf '\\%03o' $((b ^ 1)))" | dd of="$1" bs=1 seek="$2" conv=notrunc status=none
}

"$MK" "$T/m.cmf" >"$T/layout" || { echo "mkfile failed"; exit 1; }
read -r _ HOFF HLEN < <(grep '^header ' "$T/layout")
read -r _ DOFF DLEN < <(grep '^directory ' "$T/layout")

expect 0 "$CMF" verify "$T/m.cmf"; contains "OK"
expect 0 "$CMF" info "$T/m.cmf"; contains "llama"; contains "tensors:       4"; contains "q4tp"
contains "tokenizer:     present"; contains "chat template: present"
expect 0 "$CMF" info "$T/m.cmf" --json --tensors model.; contains '"tensor_count":	4'; contains '"model.norm.weight"'
expect 0 "$CMF" info "$T/m.cmf" --tensors lm_; contains "lm_head.weight"

# one flipped byte per tensor
while read -r _ name off nb; do
    cp "$T/m.cmf" "$T/x.cmf"
    flip "$T/x.cmf" $((off + nb / 2))
    expect 1 "$CMF" verify "$T/x.cmf"; contains "tensor '$name': hash64 mismatch"
done < <(grep '^tensor ' "$T/layout")
# header byte (inside the JSON text)
cp "$T/m.cmf" "$T/x.cmf"; flip "$T/x.cmf" $((HOFF + HLEN / 2))
expect 1 "$CMF" verify "$T/x.cmf"; contains "header"
# directory byte: the stored hash64 of record 0, then a shape byte
cp "$T/m.cmf" "$T/x.cmf"; flip "$T/x.cmf" $((DOFF + 16 + 48))
expect 1 "$CMF" verify "$T/x.cmf"; contains "directory: hash64 mismatch"
cp "$T/m.cmf" "$T/x.cmf"; flip "$T/x.cmf" $((DOFF + 16 + 8))
expect 1 "$CMF" verify "$T/x.cmf"; contains "directory"
# envelope magic
cp "$T/m.cmf" "$T/x.cmf"; flip "$T/x.cmf" 0
expect 1 "$CMF" verify "$T/x.cmf"; contains "magic"
# envelope flags (0x08, reserved as 0): not covered by any hash
cp "$T/m.cmf" "$T/x.cmf"; flip "$T/x.cmf" 8
expect 1 "$CMF" verify "$T/x.cmf"; contains "envelope: flags (offset 0x08) is 0x00000001"
# each problem once: a truncated file (inside the blob, and inside the
# envelope) is one FAIL line and "1 problem"; a directory is named once
for n in 1000 100; do
    head -c $n "$T/m.cmf" >"$T/x.cmf"
    expect 1 "$CMF" verify "$T/x.cmf"; contains "FAILED (1 problem,"
    [ "$(grep -c '^FAIL ' "$T/out")" = 1 ] || { fail "truncated at $n: not exactly one FAIL line"; sed 's/^/    /' "$T/out"; }
done
mkdir -p "$T/adir"
expect 1 "$CMF" verify "$T/adir"
[ "$(grep -c 'is a directory' "$T/out")" = 1 ] || { fail "verify DIR: 'is a directory' not exactly once"; sed 's/^/    /' "$T/out"; }
expect 1 "$CMF" info "$T/adir"; contains "is a directory"

# keys and signatures
cp "$T/m.cmf" "$T/c0.cmf"
expect 0 "$CMF" keygen -o "$T/key.json"
[ "$(stat -c %a "$T/key.json")" = 600 ] || fail "key file mode is not 0600"
expect 1 "$CMF" keygen -o "$T/key.json"; contains "exists"
expect 0 "$CMF" sign "$T/m.cmf" --key "$T/key.json"
[ -f "$T/m.cmf.sig" ] || fail "no .sig written"
expect 0 "$CMF" verify "$T/m.cmf"; contains "signature"
expect 0 "$CMF" verify "$T/m.cmf" --pubkey "$T/key.json"; contains "trusted key"
PUB=$(sed 's/.*"pubkey":"\([0-9a-f]*\)".*/\1/' "$T/key.json")
expect 0 "$CMF" verify "$T/m.cmf" --pubkey "$PUB"
expect 0 "$CMF" keygen -o "$T/other.json"; contains "pubkey "
expect 1 "$CMF" verify "$T/m.cmf" --pubkey "$T/other.json"; contains "other than the trusted"
expect 1 "$CMF" verify "$T/c0.cmf" --pubkey "$PUB"
cp "$T/m.cmf" "$T/s.cmf"; cp "$T/m.cmf.sig" "$T/s.cmf.sig"
# a padding byte (not covered by any hash64) still breaks the signature
flip "$T/s.cmf" $((DOFF + DLEN + 1))
expect 1 "$CMF" verify "$T/s.cmf"; contains ".sig"
# change the signature's first hex digit (0 -> 1, anything else -> 0): the key
# is random per run, so the edit must change the digit whatever it was
cp "$T/m.cmf" "$T/s.cmf"
sed -i -E 's/"sig":"0/"sig":"X/; s/"sig":"[1-9a-f]/"sig":"0/; s/"sig":"X/"sig":"1/' "$T/s.cmf.sig"
cmp -s "$T/m.cmf.sig" "$T/s.cmf.sig" && fail "signature edit left the .sig unchanged"
expect 1 "$CMF" verify "$T/s.cmf"; contains ".sig"
expect 1 "$CMF" sign "$T/m.cmf" --key "$T/nokey.json"
# a "key" that is a device or a huge file is refused by size, not read whole
expect 1 "$CMF" sign "$T/m.cmf" --key /dev/zero; contains "/dev/zero: longer than 65536 bytes"
truncate -s 100M "$T/big.json"
expect 1 "$CMF" sign "$T/m.cmf" --key "$T/big.json"; contains "longer than 65536 bytes"
rm -f "$T/big.json"

# compact
expect 0 "$CMF" compact "$T/m.cmf" -o "$T/c.cmf"
expect 0 "$CMF" verify "$T/c.cmf"
cmp -s "$T/m.cmf" "$T/c.cmf" || fail "compact of a compact file should be byte-identical"
cp "$T/m.cmf" "$T/x.cmf"; rm -f "$T/x.cmf.sig"
read -r _ _ TOFF _ < <(grep '^tensor ' "$T/layout" | head -1)
flip "$T/x.cmf" $((TOFF + 3))
expect 1 "$CMF" compact "$T/x.cmf" -o "$T/c2.cmf"; contains "hash64 mismatch"
[ -e "$T/c2.cmf" ] && fail "compact left an output after failing"
ls "$T" | grep -q '\.tmp$' && fail "temporary files left in $T"

# shard sets: any shard name opens and verifies the set; a missing shard fails
"$MK" "$T/sh.cmf" 9000 || fail "sharded mkfile"
S2=$(ls "$T" | grep '^sh-00002-of-' | head -1)
[ -n "$S2" ] || fail "no shard 2 written"
if [ -n "$S2" ]; then
    expect 0 "$CMF" info "$T/$S2"; contains "tensors:       4"; contains "sh-00001-of-"; contains "tokenizer:     present"
    expect 0 "$CMF" verify "$T/$S2"
    # the path given to the sharded write (-o of convert) opens the set too
    NS=${S2#sh-00002-of-}; NS=$((10#${NS%.cmf}))
    expect 0 "$CMF" info "$T/sh.cmf"; contains "tensors:       4"; contains "shards:        $NS"
    contains "sh-00001-of-"; contains "tokenizer:     present"
    expect 0 "$CMF" verify "$T/sh.cmf"; contains "OK (4 tensors"
    # ... unless stale shards of another write make the stem ambiguous
    cp "$T/$S2" "$T/sh-00001-of-00099.cmf"
    expect 1 "$CMF" info "$T/sh.cmf"; contains "2 shard sets were written to it"
    expect 1 "$CMF" verify "$T/sh.cmf"; contains "2 shard sets were written to it"
    rm -f "$T/sh-00001-of-00099.cmf"
    S1=${S2/00002-of/00001-of}
    mv "$T/$S1" "$T/moved"
    expect 1 "$CMF" info "$T/$S2"; contains "shard 1"
    mv "$T/moved" "$T/$S1"
fi

# usage and help
for c in info verify sign keygen compact; do expect 0 "$CMF" $c --help; contains "usage: cmf $c"; done
expect 2 "$CMF" info
expect 2 "$CMF" verify
expect 2 "$CMF" info "$T/m.cmf" --bogus
expect 2 "$CMF" sign "$T/m.cmf"
expect 2 "$CMF" compact "$T/m.cmf"
expect 2 "$CMF" keygen
expect 1 "$CMF" info "$T/missing.cmf"; contains "missing.cmf"
expect 1 "$CMF" verify "$T/missing.cmf"

# --device on a model command takes what `cmf serve --device` takes: cpu:t=N
# runs (the text of -t N), a bad t or an unknown device is named
DEMO=$2/models/demo/demo-base.cmf
if [ -f "$DEMO" ]; then
    "$CMF" run "$DEMO" --greedy -n 8 -p "Once upon a time" -t 2 >"$T/t2" 2>/dev/null || fail "run -t 2"
    "$CMF" run "$DEMO" --greedy -n 8 -p "Once upon a time" --device cpu:t=2 >"$T/d2" 2>"$T/out" ||
        { fail "run --device cpu:t=2"; sed 's/^/    /' "$T/out"; }
    [ -s "$T/t2" ] && cmp -s "$T/t2" "$T/d2" || fail "--device cpu:t=2 text differs from -t 2's"
    expect 2 "$CMF" run "$DEMO" -n 2 -p hi --device cpu:t=0; contains 'cpu:t=0'
    expect 2 "$CMF" run "$DEMO" -n 2 -p hi --device tpu; contains 'device "tpu"'
    # a tensor name damaged in the directory (open checks no hashes): a layer without the norm the
    # others have, or no final norm, is refused, not run without it (it printed other text, exit 0)
    for pair in "model.layers.5.input_layernorm.weight model.layers.5.input_layernorX.weight" \
                "model.norm.weight model.norX.weight"; do
        set -- $pair
        python3 -c 'import sys; d=open(sys.argv[1],"rb").read(); a,b=sys.argv[3].encode(),sys.argv[4].encode(); assert a in d; open(sys.argv[2],"wb").write(d.replace(a,b,1))' \
            "$DEMO" "$T/renamed.cmf" "$1" "$2"
        expect 1 "$CMF" run "$T/renamed.cmf" -n 2 -p hi --greedy; contains "$1"
    done
    rm -f "$T/renamed.cmf"
fi

[ $fails = 0 ] && echo "all CLI checks passed" && exit 0
echo "$fails failure(s)"; exit 1
