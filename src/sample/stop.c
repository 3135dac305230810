/*
 * stop.c — stop strings over streamed text (cmf/sample.h).
 *
 * Text arrives in pieces (one per token) and a stop string may span several
 * pieces, so the matcher keeps a buffer `buf` of text not yet released:
 *   1. append the new piece;
 *   2. if some stop string occurs in the buffer, release everything before
 *      the earliest-starting occurrence and report the stop. A stop is
 *      reported as soon as one completes: with stops "abcd" and "c", the
 *      pieces "ab","c" stop at "c" (output "ab") even if "d" would have
 *      followed, as llama.cpp's server does; "abcd" in one piece gives "";
 *   3. otherwise hold back the longest tail of the buffer that is a proper
 *      prefix of some stop string and release the rest.
 * Only such a tail can grow into a stop, so the output lags the input by at
 * most (longest stop - 1) bytes and never by more than needed. A stop string
 * is valid UTF-8, so a held tail starts at its first byte (a lead byte):
 * when the pieces are whole characters the released text is too.
 * After a stop every further feed releases nothing and returns true.
 * The released text stays at the front of `buf` until the next call, which
 * drops it first (so the pointer handed out stays valid until then).
 */
#include "cmf/sample.h"

#include <stdlib.h>
#include <string.h>

struct cmf_stop_matcher {
    char **stops;
    size_t *stop_len;
    size_t n_stops;
    char *buf;
    size_t len, cap;
    size_t released; /* bytes at the front of buf handed out by the last call */
    bool stopped;
};

cmf_status cmf_stop_matcher_new(const char *const *stops, size_t n_stops, cmf_stop_matcher **out,
                                cmf_error *err) {
    if (!out) return cmf_error_set(err, CMF_ERR_ARG, "cmf_stop_matcher_new: out is NULL");
    *out = NULL;
    if (n_stops && !stops)
        return cmf_error_set(err, CMF_ERR_ARG, "stop strings: array is NULL but n_stops is %zu",
                             n_stops);
    for (size_t i = 0; i < n_stops; i++)
        if (!stops[i] || !stops[i][0])
            return cmf_error_set(err, CMF_ERR_ARG, "stop strings: string %zu is %s", i,
                                 stops[i] ? "empty" : "NULL");
    cmf_stop_matcher *m = calloc(1, sizeof *m);
    if (!m) return cmf_error_set(err, CMF_ERR_NOMEM, "stop strings: out of memory");
    if (n_stops) {
        m->stops = calloc(n_stops, sizeof *m->stops);
        m->stop_len = calloc(n_stops, sizeof *m->stop_len);
        if (!m->stops || !m->stop_len) goto nomem;
    }
    m->n_stops = n_stops;
    for (size_t i = 0; i < n_stops; i++) {
        m->stop_len[i] = strlen(stops[i]);
        m->stops[i] = strdup(stops[i]);
        if (!m->stops[i]) goto nomem;
    }
    *out = m;
    return CMF_OK;
nomem:
    cmf_stop_matcher_free(m);
    return cmf_error_set(err, CMF_ERR_NOMEM, "stop strings: out of memory");
}

void cmf_stop_matcher_free(cmf_stop_matcher *m) {
    if (!m) return;
    if (m->stops)
        for (size_t i = 0; i < m->n_stops; i++) free(m->stops[i]);
    free(m->stops);
    free(m->stop_len);
    free(m->buf);
    free(m);
}

/* Drop the text released by the previous call. */
static void drop_released(cmf_stop_matcher *m) {
    if (m->released) {
        memmove(m->buf, m->buf + m->released, m->len - m->released);
        m->len -= m->released;
        m->released = 0;
    }
}

/* Length of the longest tail of buf[0..len) that is a proper prefix of some
 * stop string. */
static size_t held_tail(const cmf_stop_matcher *m) {
    size_t best = 0;
    for (size_t i = 0; i < m->n_stops; i++) {
        size_t sl = m->stop_len[i];
        size_t max = sl - 1 < m->len ? sl - 1 : m->len;
        for (size_t h = max; h > best; h--) {
            if (memcmp(m->buf + m->len - h, m->stops[i], h) == 0) {
                best = h;
                break;
            }
        }
    }
    return best;
}

bool cmf_stop_matcher_feed(cmf_stop_matcher *m, const char *text, size_t len, const char **emit,
                           size_t *emit_len) {
    static const char empty[1] = {0};
    *emit = empty;
    *emit_len = 0;
    if (!m) return false;
    drop_released(m);
    if (m->stopped) return true;
    if (len) {
        if (m->len + len + 1 > m->cap) {
            size_t cap = m->cap ? m->cap : 64;
            while (cap < m->len + len + 1) cap *= 2;
            char *nb = realloc(m->buf, cap);
            if (!nb) {
                /* Out of memory (buffers of a few bytes: practically never):
                 * release the held text, or the piece itself when nothing is
                 * held, unmatched; with text held the piece is lost. */
                *emit = m->len ? m->buf : text;
                *emit_len = m->len ? m->len : len;
                m->released = m->len;
                return false;
            }
            m->buf = nb;
            m->cap = cap;
        }
        memcpy(m->buf + m->len, text, len);
        m->len += len;
        m->buf[m->len] = '\0';
    }
    if (m->len == 0) return false; /* nothing held, nothing fed */
    /* earliest complete stop string */
    size_t first = m->len;
    for (size_t i = 0; i < m->n_stops; i++) {
        const char *hit = memmem(m->buf, m->len, m->stops[i], m->stop_len[i]);
        if (hit && (size_t)(hit - m->buf) < first) first = (size_t)(hit - m->buf);
    }
    if (first < m->len) {
        m->stopped = true;
        m->len = first; /* the stop and what follows are discarded */
        *emit = m->buf;
        *emit_len = first;
        m->released = first;
        return true;
    }
    size_t rel = m->len - held_tail(m);
    if (m->buf) *emit = m->buf;
    *emit_len = rel;
    m->released = rel;
    return false;
}

void cmf_stop_matcher_flush(cmf_stop_matcher *m, const char **emit, size_t *emit_len) {
    static const char empty[1] = {0};
    *emit = empty;
    *emit_len = 0;
    if (!m) return;
    drop_released(m);
    if (m->stopped || m->len == 0) return;
    *emit = m->buf;
    *emit_len = m->len;
    m->released = m->len;
}
