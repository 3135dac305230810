#!/usr/bin/env python3
"""Minimal CMF v2 reader in numpy, for computing reference outputs on the
exact weights a .cmf file ships (format: docs/FORMAT.md).

Reads the 128-byte envelope (§1), the header JSON (§2), the tensor directory
(§3) and dequantizes tensors of dtype f32 (0), f16 (1), bf16 (2), q8_row (3),
q4_block (4) and q4_tiled (11) to float32 numpy arrays of the directory's
shape ([out, in] for matrices).  `hash64` (§5) verifies every payload it
reads.  The tokenizer section (§6) is returned verbatim (tokenizer.json).

Errors raise ValueError naming the file and the field at fault.

  python3 cmf_reader.py FILE.cmf      # prints header summary and tensor list
"""
import json
import struct
import sys

import numpy as np

MAGIC = b"CMF\x01"
M64 = (1 << 64) - 1
DTYPES = {0: "f32", 1: "f16", 2: "bf16", 3: "q8_row", 4: "q4_block", 8: "vbit", 9: "q8_2f",
          10: "vbit_ro", 11: "q4_tiled", 12: "q1", 13: "q1s", 14: "q1t", 15: "q4tp", 16: "q2tp"}


def _fmix64(x):
    """fmix64 on a numpy uint64 array (wrapping arithmetic)."""
    x = x ^ (x >> np.uint64(33))
    x = x * np.uint64(0xFF51AFD7ED558CCD)
    x = x ^ (x >> np.uint64(33))
    x = x * np.uint64(0xC4CEB9FE1A85EC53)
    return x ^ (x >> np.uint64(33))


def hash64(b):
    """CMF hash64 of a bytes-like object (format §5)."""
    b = bytes(b)
    n = len(b)
    pad = (-n) % 8
    w = np.frombuffer(b + b"\0" * pad, dtype="<u8")
    with np.errstate(over="ignore"):
        idx = np.arange(len(w), dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
        acc = np.bitwise_xor.reduce(_fmix64(w) ^ idx) if len(w) else np.uint64(0)
        acc = np.uint64(acc) ^ np.uint64(n)
        return int(_fmix64(np.array([acc], dtype=np.uint64))[0])


class CmfFile:
    def __init__(self, path):
        self.path = path
        with open(path, "rb") as f:
            self.buf = f.read()
        b = self.buf
        if len(b) < 128 or b[:4] != MAGIC:
            raise ValueError(f"{path}: not a CMF file (bad magic)")
        version, flags, feats = struct.unpack_from("<III", b, 4)
        if version != 2:
            raise ValueError(f"{path}: envelope.version {version}, expected 2")
        if feats & ~0b1100111:
            raise ValueError(f"{path}: envelope.required_features has unknown bits 0x{feats:x}")
        secs = struct.unpack_from("<12Q", b, 0x10)
        names = ["header", "directory", "blob", "masks", "tokenizer", "sparse"]
        self.sections = {}
        for i, nm in enumerate(names):
            off, ln = secs[2 * i], secs[2 * i + 1]
            if ln and off + ln > len(b):
                raise ValueError(f"{path}: section {nm} [{off}, +{ln}) past end of file ({len(b)})")
            self.sections[nm] = (off, ln)
        if self.sections["blob"][0] % 4096:
            raise ValueError(f"{path}: weight blob offset {self.sections['blob'][0]} not a multiple of 4096")
        ho, hl = self.sections["header"]
        self.header = json.loads(b[ho:ho + hl].decode("utf-8"))
        self.tensors = self._directory()

    def _directory(self):
        b, p = self.buf, self.path
        do, dl = self.sections["directory"]
        count, pool_off = struct.unpack_from("<QQ", b, do)
        if 16 + count * 56 > dl or pool_off > dl:
            raise ValueError(f"{p}: directory count {count} / pool_off {pool_off} exceed its length {dl}")
        bo, bl = self.sections["blob"]
        out = {}
        for i in range(count):
            r = do + 16 + 56 * i
            name_off, name_len, dt, nd = struct.unpack_from("<IHBB", b, r)
            shape = struct.unpack_from("<6I", b, r + 8)
            off, nbytes, h = struct.unpack_from("<QQQ", b, r + 32)
            s = do + pool_off + name_off
            name = b[s:s + name_len].decode("utf-8")
            if dt not in DTYPES:
                raise ValueError(f"{p}: tensor {name}: unknown dtype {dt}")
            if nd > 6:
                raise ValueError(f"{p}: tensor {name}: ndim {nd} > 6")
            if off + nbytes > bl:
                raise ValueError(f"{p}: tensor {name}: off+nbytes {off + nbytes} exceeds blob {bl}")
            out[name] = dict(dtype=DTYPES[dt], shape=tuple(shape[:nd]), off=bo + off, nbytes=nbytes, hash=h)
        return out

    def tokenizer_json(self):
        o, n = self.sections["tokenizer"]
        return self.buf[o:o + n].decode("utf-8") if n else None

    def tensor(self, name, verify=True):
        """Return the tensor dequantized to float32, shape as in the directory."""
        t = self.tensors[name]
        raw = self.buf[t["off"]:t["off"] + t["nbytes"]]
        where = f"{self.path}: tensor {name}"
        if verify and t["hash"] and hash64(raw) != t["hash"]:
            raise ValueError(f"{where}: payload hash mismatch")
        shape, dt = t["shape"], t["dtype"]
        n = int(np.prod(shape)) if shape else 1

        def need(k):
            if len(raw) != k:
                raise ValueError(f"{where}: {dt} payload is {len(raw)} bytes, expected {k}")
        if dt == "f32":
            need(4 * n)
            return np.frombuffer(raw, "<f4").reshape(shape).astype(np.float32)
        if dt == "f16":
            need(2 * n)
            return np.frombuffer(raw, "<f2").astype(np.float32).reshape(shape)
        if dt == "bf16":
            need(2 * n)
            u = np.frombuffer(raw, "<u2").astype(np.uint32) << 16
            return u.view(np.float32).reshape(shape)
        if dt == "q8_row":
            rows, cols = shape
            need(rows * cols + 2 * rows)
            q = np.frombuffer(raw, np.int8, rows * cols).reshape(rows, cols).astype(np.float32)
            sc = np.frombuffer(raw, "<f2", rows, rows * cols).astype(np.float32)
            return q * sc[:, None]
        if dt in ("q4_block", "q4_tiled"):
            ng = (n + 31) // 32
            if dt == "q4_block":
                need(16 * ng + 2 * ng)
                nib = np.frombuffer(raw, np.uint8, 16 * ng).reshape(ng, 16)
                sc = np.frombuffer(raw, "<f2", ng, 16 * ng).astype(np.float32)
            else:
                need(18 * ng)
                tiles = np.frombuffer(raw, np.uint8).reshape(ng, 18)
                sc = tiles[:, :2].copy().view("<f2").astype(np.float32)[:, 0]
                nib = tiles[:, 2:]
            q = np.stack([nib & 15, nib >> 4], axis=-1).reshape(ng, 32).astype(np.float32) - 8.0
            return (q * sc[:, None]).reshape(-1)[:n].reshape(shape)
        raise ValueError(f"{where}: dtype {dt} not supported by this reader")


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    c = CmfFile(sys.argv[1])
    print(json.dumps(c.header.get("arch"), indent=1))
    for n, t in c.tensors.items():
        print(f"{n:50s} {t['dtype']:8s} {t['shape']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
