// splitk_merge.glsl — the log-sum-exp merge of one head's split-K decode
// attention partials, shared by attention_comb.comp (V2: its own dispatch)
// and attention_dec2.comp (MERGE: the last workgroup of the dispatch that
// wrote them), so the two give the same bits: M = max m_c, L = Σ l_c ·
// exp(m_c - M), out[d] = Σ acc_c[d] · exp(m_c - M) / L (flash-decoding, Dao
// et al. 2023). The threads spread the latency: M and L with the threads
// over chunks in a fixed strided order, subgroupMax/Add, then the subgroups
// in order; each output dim's sum over the chunks ascending with 8 chunks'
// loads in flight. A chunk that saw no key (m = -inf) adds nothing; no
// chunk at all gives 0 / 0.
//
// The including shader defines MERGE_BUF (the buffer reference type the
// partials are read through: F32, or a coherent one when other workgroups
// of the same dispatch wrote them) and declares `shared float red[]` with a
// value for each subgroup. Partials: n chunks of hd + 2 floats (acc[hd], m,
// l) from float index base; out: hd floats from index o. Uniform control
// flow; ends with a barrier (red may be written again after it).
#ifndef NEG_INF
#define NEG_INF uintBitsToFloat(0xff800000u)
#endif

void splitk_merge(uint64_t part, uint base, uint n, uint hd, uint64_t out_, uint o) {
    MERGE_BUF W = MERGE_BUF(part);
    F32 O = F32(out_);
    uint tid = gl_LocalInvocationID.x, sg = gl_SubgroupID, nsg = gl_NumSubgroups, stride = hd + 2;
    float mx = NEG_INF;
    for (uint c = tid; c < n; c += WG) mx = max(mx, W.v[base + c * stride + hd]);
    mx = subgroupMax(mx);
    if (subgroupElect()) red[sg] = mx;
    barrier();
    float M = NEG_INF;
    for (uint i = 0; i < nsg; i++) M = max(M, red[i]);
    barrier();
    float ls = 0.0;
    for (uint c = tid; c < n; c += WG) {
        float m = W.v[base + c * stride + hd];
        if (m != NEG_INF) ls += W.v[base + c * stride + hd + 1] * exp(m - M);
    }
    ls = subgroupAdd(ls);
    if (subgroupElect()) red[sg] = ls;
    barrier();
    float L = 0.0;
    for (uint i = 0; i < nsg; i++) L += red[i];
    for (uint d = tid; d < hd; d += WG) {
        float s = 0.0;
        for (uint c0 = 0; c0 < n; c0 += 8) {
            float mv[8], av[8];
            for (uint u = 0; u < 8; u++) {
                uint c = c0 + u;
                mv[u] = c < n ? W.v[base + c * stride + hd] : NEG_INF;
                av[u] = c < n ? W.v[base + c * stride + d] : 0.0;
            }
            for (uint u = 0; u < 8; u++)
                if (mv[u] != NEG_INF) s += av[u] * exp(mv[u] - M);
        }
        O.v[o + d] = s / L;
    }
    barrier();
}
