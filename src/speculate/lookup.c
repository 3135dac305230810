/*
 * lookup.c — the prompt-lookup drafter (cmf/speculate.h,
 * cmf_drafter_new_lookup): no model; the last n tokens of the history are
 * searched for earlier in the history (prompt and output), the latest
 * occurrence first, and the tokens that followed that occurrence are the
 * draft (Saxena 2023, "Prompt lookup decoding"; llama.cpp's lookup
 * examples). Shorter suffixes, down to one token, are tried when the
 * longest finds nothing. Drafts are deterministic: q is one-hot.
 * Cost: O(n_history · n_gram) per proposal, no state per sequence.
 */
#include "cmf/speculate.h"

#include <stdlib.h>
#include <string.h>

typedef struct lookup {
    uint32_t n_gram;
} lookup;

static cmf_status lk_seq_new(void *impl, const cmf_draft_seq_params *p, void **seq, cmf_error *err) {
    (void)impl, (void)p, (void)err;
    *seq = NULL; /* stateless: the history comes with every request */
    return CMF_OK;
}

static cmf_status lk_propose(void *impl, void *seq, cmf_draft_request *rq, cmf_error *err) {
    (void)seq, (void)err;
    const lookup *lk = impl;
    const int32_t *h = rq->history;
    const uint32_t n = rq->n_history;
    rq->q_onehot = true;
    for (uint32_t m = lk->n_gram < n ? lk->n_gram : n - 1; m >= 1; m--) {
        const int32_t *suf = h + (n - m);
        /* the latest earlier start j with h[j..j+m) == suffix, j + m < n so
         * at least one token follows it */
        for (uint32_t j = n - m; j-- > 0;) {
            if (memcmp(h + j, suf, m * sizeof *h) != 0) continue;
            uint32_t c = 0;
            for (uint32_t t = j + m; t < n && c < rq->k_max; t++) rq->draft[c++] = h[t];
            rq->n_draft = c;
            return CMF_OK;
        }
    }
    rq->n_draft = 0;
    return CMF_OK;
}

static void lk_free(void *impl) { free(impl); }

cmf_status cmf_drafter_new_lookup(uint32_t n_gram, uint32_t n_vocab, cmf_drafter **out, cmf_error *err) {
    if (n_gram < 1 || n_gram > 8)
        return cmf_error_set(err, CMF_ERR_ARG, "speculate: lookup: n-gram size %u outside [1, 8]", n_gram);
    if (n_vocab == 0) return cmf_error_set(err, CMF_ERR_ARG, "speculate: lookup: n_vocab 0");
    lookup *lk = malloc(sizeof *lk);
    if (!lk) return cmf_error_set(err, CMF_ERR_NOMEM, "speculate: lookup: out of memory");
    lk->n_gram = n_gram;
    static const cmf_drafter_ops ops = {.seq_new = lk_seq_new, .propose = lk_propose, .free = lk_free};
    cmf_drafter_info info = {.name = "lookup", .n_vocab = n_vocab};
    return cmf_drafter_new(&ops, lk, &info, out, err);
}
