#!/usr/bin/env python3
# spv_coop_khr.py — rewrites a SPIR-V module that uses SPV_NV_cooperative_matrix
# into the same module on SPV_KHR_cooperative_matrix (usage: IN.spv OUT.spv).
# Debian 12's glslc (shaderc 2023.2, glslang 11.13) predates
# GL_KHR_cooperative_matrix, so shaders/matmul_coop.comp is written against
# the NV extension and this turns its SPIR-V into the KHR form:
#   - OpCapability CooperativeMatrixNV -> CooperativeMatrixKHR, the extension name;
#   - OpTypeCooperativeMatrixNV (component, scope, rows, cols) ->
#     OpTypeCooperativeMatrixKHR (..., use): the use is told from the type:
#     a 32-bit float matrix is the accumulator, a 16-bit one with as many
#     columns as rows is A (M x K with M = K = 16), one with fewer columns is
#     B (K x N); any other shape is refused;
#   - loads and stores: the "column major" bool operand becomes the
#     MemoryLayout operand (a uint constant 0 row-major / 1 column-major),
#     placed before the stride;
#   - MulAdd and Length: the KHR opcodes, same operands.
# Opcode numbers are those of the SPIR-V registry (spirv.core.grammar.json).
import struct, sys

OP_EXTENSION, OP_CAPABILITY, OP_TYPE_INT, OP_TYPE_FLOAT = 10, 17, 21, 22
OP_CONSTANT_TRUE, OP_CONSTANT_FALSE, OP_CONSTANT = 41, 42, 43
NV_TYPE, NV_LOAD, NV_STORE, NV_MULADD, NV_LENGTH, NV_CAP = 5358, 5359, 5360, 5361, 5362, 5357
KHR_TYPE, KHR_LOAD, KHR_STORE, KHR_MULADD, KHR_LENGTH, KHR_CAP = 4456, 4457, 4458, 4459, 4460, 6022


def fail(msg):
    sys.stderr.write("spv_coop_khr.py: %s\n" % msg)
    sys.exit(1)


def ext_words(name):
    b = name.encode() + b"\0"
    b += b"\0" * (-len(b) % 4)
    return list(struct.unpack("<%dI" % (len(b) // 4), b))


def main():
    if len(sys.argv) != 3:
        fail("usage: spv_coop_khr.py IN.spv OUT.spv")
    data = open(sys.argv[1], "rb").read()
    if len(data) % 4 or len(data) < 20:
        fail("%s: not a SPIR-V module" % sys.argv[1])
    w = list(struct.unpack("<%dI" % (len(data) // 4), data))
    if w[0] != 0x07230203:
        fail("%s: not a little-endian SPIR-V module" % sys.argv[1])
    insts, i = [], 5
    while i < len(w):
        n, op = w[i] >> 16, w[i] & 0xFFFF
        if n == 0 or i + n > len(w):
            fail("%s: truncated instruction at word %d" % (sys.argv[1], i))
        insts.append([op] + w[i + 1:i + n])
        i += n
    uint_id, floats, consts, bools = None, {}, {}, {}
    for ins in insts:
        op = ins[0]
        if op == OP_TYPE_INT and ins[2] == 32 and ins[3] == 0:
            uint_id = ins[1]
        elif op == OP_TYPE_FLOAT:
            floats[ins[1]] = ins[2]
        elif op == OP_CONSTANT and len(ins) == 4:
            consts[ins[2]] = ins[3]
        elif op in (OP_CONSTANT_TRUE, OP_CONSTANT_FALSE):
            bools[ins[2]] = op == OP_CONSTANT_TRUE
    if uint_id is None:
        fail("no 32-bit uint type in the module")
    bound = w[3]
    k = [bound, bound + 1, bound + 2]  # uint constants 0, 1, 2
    w[3] = bound + 3
    out, done_consts, n_nv = [], False, 0
    for ins in insts:
        op = ins[0]
        if op == OP_CAPABILITY and ins[1] == NV_CAP:
            ins = [op, KHR_CAP]
        elif op == OP_EXTENSION and ins[1:] == ext_words("SPV_NV_cooperative_matrix"):
            ins = [op] + ext_words("SPV_KHR_cooperative_matrix")
        elif op == NV_TYPE:
            res, comp, scope, rows, cols = ins[1:6]
            if comp not in floats:
                fail("cooperative matrix of a non-float component")
            r, c = consts.get(rows), consts.get(cols)
            if floats[comp] == 32:
                use = 2
            elif floats[comp] == 16 and r == c:
                use = 0
            elif floats[comp] == 16 and c is not None and r is not None and c < r:
                use = 1
            else:
                fail("cooperative matrix type %d: cannot tell its use from its shape" % res)
            ins = [KHR_TYPE, res, comp, scope, rows, cols, k[use]]
            n_nv += 1
        elif op == NV_LOAD:
            rt, res, ptr, stride, colmaj = ins[1:6]
            if colmaj not in bools:
                fail("a load's column-major operand is not a constant")
            ins = [KHR_LOAD, rt, res, ptr, k[1 if bools[colmaj] else 0], stride] + ins[6:]
        elif op == NV_STORE:
            ptr, obj, stride, colmaj = ins[1:5]
            if colmaj not in bools:
                fail("a store's column-major operand is not a constant")
            ins = [KHR_STORE, ptr, obj, k[1 if bools[colmaj] else 0], stride] + ins[5:]
        elif op == NV_MULADD:
            ins = [KHR_MULADD] + ins[1:]
        elif op == NV_LENGTH:
            ins = [KHR_LENGTH] + ins[1:]
        elif op in (NV_CAP,):
            pass
        out.append(ins)
        if op == OP_TYPE_INT and ins[1] == uint_id and not done_consts:
            for v in range(3):
                out.append([OP_CONSTANT, uint_id, k[v], v])
            done_consts = True
    if n_nv == 0:
        fail("no NV cooperative matrix type in the module")
    words = w[:5]
    for ins in out:
        words.append((len(ins) << 16) | ins[0])
        words.extend(ins[1:])
    open(sys.argv[2], "wb").write(struct.pack("<%dI" % len(words), *words))


if __name__ == "__main__":
    main()
