/*
 * metrics.c — GET /metrics in the Prometheus text exposition format
 * (version 0.0.4): request counts by status class, prompt and generated
 * tokens, cancellations and 429s, sequences running and waiting, KV pages
 * by state, and histograms of time to first token, inter-token latency
 * and request latency (seconds, cumulative `le` buckets), and the
 * speculative decoding counters (drafted, accepted, acceptance rate, mean
 * accepted length).
 */
#include "server/server.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

static const double bounds[SRV_HIST_N] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                          1, 2.5, 5, 10, 30, 60, 120};

void srv_hist_add(srv_hist *h, double v) {
    size_t i = 0;
    while (i < SRV_HIST_N && v > bounds[i]) i++;
    h->count[i]++;
    h->sum += v;
    h->n++;
}

typedef struct buf { char *p; size_t len, cap; bool oom; } buf;

static void put(buf *b, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
static void put(buf *b, const char *fmt, ...) {
    if (b->oom) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
        va_end(ap);
        if (n < 0) { b->oom = true; return; }
        if ((size_t)n < b->cap - b->len) { b->len += (size_t)n; return; }
        size_t cap = b->cap * 2 + (size_t)n;
        char *p = realloc(b->p, cap);
        if (!p) { b->oom = true; return; }
        b->p = p;
        b->cap = cap;
    }
}

static void hist(buf *b, const char *name, const char *help, const srv_hist *h) {
    put(b, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    uint64_t cum = 0;
    for (size_t i = 0; i < SRV_HIST_N; i++) {
        cum += h->count[i];
        put(b, "%s_bucket{le=\"%g\"} %llu\n", name, bounds[i], (unsigned long long)cum);
    }
    cum += h->count[SRV_HIST_N];
    put(b, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.6f\n%s_count %llu\n", name, (unsigned long long)cum, name, h->sum,
        name, (unsigned long long)h->n);
}

char *srv_metrics_text(srv *s) {
    buf b = {.p = malloc(4096), .cap = 4096};
    if (!b.p) return NULL;
    b.p[0] = 0;
    const srv_metrics *m = &s->m;
    put(&b, "# HELP cmf_requests_total HTTP requests answered, by status class.\n# TYPE cmf_requests_total counter\n");
    for (int i = 1; i <= 5; i++) put(&b, "cmf_requests_total{code=\"%dxx\"} %llu\n", i, (unsigned long long)m->requests[i]);
    put(&b, "# HELP cmf_prompt_tokens_total Prompt tokens of accepted generation requests.\n# TYPE cmf_prompt_tokens_total counter\n");
    put(&b, "cmf_prompt_tokens_total %llu\n", (unsigned long long)m->prompt_tokens);
    put(&b, "# HELP cmf_generation_tokens_total Tokens sampled.\n# TYPE cmf_generation_tokens_total counter\n");
    put(&b, "cmf_generation_tokens_total %llu\n", (unsigned long long)m->gen_tokens);
    put(&b, "# HELP cmf_device_sampled_tokens_total Tokens sampled on the model's device (its top-k candidates read back, not the logits).\n# TYPE cmf_device_sampled_tokens_total counter\n");
    put(&b, "cmf_device_sampled_tokens_total %llu\n", (unsigned long long)m->device_sampled);
    put(&b, "# HELP cmf_requests_cancelled_total Requests whose client went away before the end.\n# TYPE cmf_requests_cancelled_total counter\n");
    put(&b, "cmf_requests_cancelled_total %llu\n", (unsigned long long)m->cancelled);
    put(&b, "# HELP cmf_requests_rejected_total Requests answered 429 (queue full).\n# TYPE cmf_requests_rejected_total counter\n");
    put(&b, "cmf_requests_rejected_total %llu\n", (unsigned long long)m->rejected_429);
    put(&b, "# HELP cmf_sequences_running Sequences holding KV after the last step.\n# TYPE cmf_sequences_running gauge\n");
    put(&b, "cmf_sequences_running %u\n", m->running);
    put(&b, "# HELP cmf_sequences_waiting Sequences queued (incl. preempted).\n# TYPE cmf_sequences_waiting gauge\n");
    put(&b, "cmf_sequences_waiting %u\n", m->waiting);
    put(&b, "# HELP cmf_sequences_in_flight Sequences accepted and not finished.\n# TYPE cmf_sequences_in_flight gauge\n");
    put(&b, "cmf_sequences_in_flight %u\n", s->in_flight);
    put(&b, "# HELP cmf_kv_pages KV cache pages by state.\n# TYPE cmf_kv_pages gauge\n");
    put(&b, "cmf_kv_pages{state=\"free\"} %u\ncmf_kv_pages{state=\"cached\"} %u\ncmf_kv_pages{state=\"used\"} %u\n",
        m->kv.n_free, m->kv.n_cached, m->kv.n_used);
    put(&b, "# HELP cmf_engine_steps_total Engine steps run.\n# TYPE cmf_engine_steps_total counter\n");
    put(&b, "cmf_engine_steps_total %llu\n", (unsigned long long)m->steps);
    const cmf_spec_stats *sp = &m->spec;
    put(&b, "# HELP cmf_spec_draft_tokens_total Drafted tokens verified (speculative decoding).\n# TYPE cmf_spec_draft_tokens_total counter\n");
    put(&b, "cmf_spec_draft_tokens_total %llu\n", (unsigned long long)sp->n_drafted);
    put(&b, "# HELP cmf_spec_accepted_tokens_total Drafted tokens the target accepted.\n# TYPE cmf_spec_accepted_tokens_total counter\n");
    put(&b, "cmf_spec_accepted_tokens_total %llu\n", (unsigned long long)sp->n_accepted);
    put(&b, "# HELP cmf_spec_verify_steps_total Verify chunks with drafts (one per sequence and step).\n# TYPE cmf_spec_verify_steps_total counter\n");
    put(&b, "cmf_spec_verify_steps_total %llu\n", (unsigned long long)sp->n_steps);
    put(&b, "# HELP cmf_spec_plain_steps_total Decodes of speculating sequences without drafts (adaptive length 0, no guess).\n# TYPE cmf_spec_plain_steps_total counter\n");
    put(&b, "cmf_spec_plain_steps_total %llu\n", (unsigned long long)sp->n_plain);
    put(&b, "# HELP cmf_spec_acceptance_rate Accepted over drafted tokens since start (0 before any draft).\n# TYPE cmf_spec_acceptance_rate gauge\n");
    put(&b, "cmf_spec_acceptance_rate %.6f\n", cmf_spec_stats_acceptance(sp));
    put(&b, "# HELP cmf_spec_mean_accepted_length Accepted drafts per verify step since start (tokens per step minus one).\n# TYPE cmf_spec_mean_accepted_length gauge\n");
    put(&b, "cmf_spec_mean_accepted_length %.6f\n", cmf_spec_stats_mean_accepted(sp));
    hist(&b, "cmf_time_to_first_token_seconds", "From request arrival to its first token.", &m->ttft);
    hist(&b, "cmf_inter_token_latency_seconds", "Between two tokens of one sequence.", &m->itl);
    hist(&b, "cmf_request_latency_seconds", "From request arrival to its last token.", &m->e2e);
    if (b.oom) { free(b.p); return NULL; }
    return b.p;
}
