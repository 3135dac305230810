/*
 * gen.c — generation requests on the engine: queueing a request's
 * sequences (one per choice; a bounded queue answers 429), the engine
 * thread's loop (embedding jobs, client hang-up polling, SSE pings, one
 * cmf_engine_step), the per-token callback that formats OpenAI's answers
 * (chat.completion / text_completion, streamed as SSE chunks or whole),
 * logprobs, usage, and the end of a request.
 *
 * Streaming rules kept here (each a bug seen in other servers): the first
 * chat chunk carries the role; each choice's finish_reason comes exactly
 * once, in its own last chunk; with stream_options.include_usage every
 * chunk has "usage": null and one last chunk has "choices": [] and the
 * usage; text is whole UTF-8 characters with stop strings held back and
 * never emitted (the engine's detokenizer and stop matcher); `data:
 * [DONE]` ends the stream; ": ping" comments keep a connection alive while
 * a long prompt is prefilled; an error after the stream started is sent
 * as a `data: {"error": ...}` event. A client that hangs up is noticed by
 * polling its socket (POLLRDHUP, then a probe write: poll_clients) before
 * every step, streamed or not (a whole answer's connection stays suspended
 * until the answer is ready, so it is always polled), and its sequences
 * are cancelled at that step; no other sequence is touched.
 */

#include "server/server.h"

#include <assert.h>
#include <math.h>
#include <poll.h>
#include <sys/socket.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- logprobs ------------------------------------------------------------ */

static char *token_text(srv *s, int32_t id) {
    char *t = NULL;
    size_t l = 0;
    cmf_error err;
    if (cmf_tokenizer_decode(s->tok, &id, 1, false, &t, &l, &err) != CMF_OK) return NULL;
    return t;
}

static cJSON *bytes_of(const char *t) {
    cJSON *a = cJSON_CreateArray();
    for (const unsigned char *p = (const unsigned char *)t; a && *p; p++)
        cJSON_AddItemToArray(a, cJSON_CreateNumber(*p));
    return a;
}

/* The token's log-probability under the model (log-softmax of the raw
 * logits, as vLLM reports it) and the top k alternatives; appended to the
 * choice's logprobs (and stream chunk). */
static void add_logprobs(srv_choice *c, const cmf_seq_event *ev, const char *text, size_t len) {
    srv_req *r = c->req;
    srv *s = r->s;
    const float *lg = ev->logits;
    uint32_t nv = ev->n_vocab;
    double mx = -INFINITY, sum = 0;
    for (uint32_t i = 0; i < nv; i++) mx = lg[i] > mx ? lg[i] : mx;
    for (uint32_t i = 0; i < nv; i++) sum += exp((double)lg[i] - mx);
    double lse = mx + log(sum);
    uint32_t k = r->gen->top_logprobs, nk = 0;
    int32_t top[SRV_MAX_TOP_LOGPROBS];
    for (uint32_t i = 0; i < nv && k; i++) {
        if (!(lg[i] > -INFINITY)) continue;
        if (nk == k && lg[i] <= lg[top[nk - 1]]) continue;
        uint32_t j = nk < k ? nk++ : nk - 1;
        while (j > 0 && lg[top[j - 1]] < lg[i]) { top[j] = top[j - 1]; j--; }
        top[j] = (int32_t)i;
    }
    char *tt = token_text(s, ev->token);
    const char *ts = tt ? tt : "";
    double lp = (double)lg[ev->token] - lse;
    if (!c->lp_chunk) c->lp_chunk = r->gen->chat ? cJSON_CreateArray() : cJSON_CreateObject();
    if (r->gen->chat) {
        cJSON *e = cJSON_CreateObject(), *tl = cJSON_CreateArray();
        cJSON_AddStringToObject(e, "token", ts);
        cJSON_AddNumberToObject(e, "logprob", isfinite(lp) ? lp : -9999.0);
        cJSON_AddItemToObject(e, "bytes", bytes_of(ts));
        for (uint32_t j = 0; j < nk; j++) {
            char *a = token_text(s, top[j]);
            cJSON *o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "token", a ? a : "");
            cJSON_AddNumberToObject(o, "logprob", (double)lg[top[j]] - lse);
            cJSON_AddItemToObject(o, "bytes", bytes_of(a ? a : ""));
            cJSON_AddItemToArray(tl, o);
            free(a);
        }
        cJSON_AddItemToObject(e, "top_logprobs", tl);
        cJSON_AddItemToArray(c->lp_chunk, e);
    } else {
        static const char *const keys[] = {"tokens", "token_logprobs", "top_logprobs", "text_offset"};
        cJSON *arr[4];
        for (int i = 0; i < 4; i++) {
            arr[i] = cJSON_GetObjectItemCaseSensitive(c->lp_chunk, keys[i]);
            if (!arr[i]) arr[i] = cJSON_AddArrayToObject(c->lp_chunk, keys[i]);
        }
        cJSON_AddItemToArray(arr[0], cJSON_CreateString(ts));
        cJSON_AddItemToArray(arr[1], cJSON_CreateNumber(isfinite(lp) ? lp : -9999.0));
        cJSON *o = cJSON_CreateObject();
        for (uint32_t j = 0; j < nk; j++) {
            char *a = token_text(s, top[j]);
            if (a && !cJSON_GetObjectItemCaseSensitive(o, a)) cJSON_AddNumberToObject(o, a, (double)lg[top[j]] - lse);
            free(a);
        }
        cJSON_AddItemToArray(arr[2], o);
        cJSON_AddItemToArray(arr[3], cJSON_CreateNumber((double)c->text_offset));
    }
    (void)text;
    c->text_offset += len;
    free(tt);
}

/* Move the chunk's logprobs into the choice's whole list (non-stream) or
 * return them for a chunk (stream). */
static cJSON *take_lp_chunk(srv_choice *c) {
    cJSON *lp = c->lp_chunk;
    c->lp_chunk = NULL;
    if (!lp) return NULL;
    if (c->req->gen->chat) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddItemToObject(o, "content", lp);
        return o;
    }
    return lp;
}

static void merge_lp(srv_choice *c) {
    cJSON *lp = c->lp_chunk;
    c->lp_chunk = NULL;
    if (!lp) return;
    if (!c->logprobs) { c->logprobs = lp; return; }
    if (c->req->gen->chat) {
        cJSON *e;
        while ((e = cJSON_DetachItemFromArray(lp, 0))) cJSON_AddItemToArray(c->logprobs, e);
    } else {
        cJSON *arr;
        cJSON_ArrayForEach(arr, lp) {
            cJSON *dst = cJSON_GetObjectItemCaseSensitive(c->logprobs, arr->string), *e;
            while ((e = cJSON_DetachItemFromArray(arr, 0))) cJSON_AddItemToArray(dst, e);
        }
    }
    cJSON_Delete(lp);
}

/* ---- tool calls -------------------------------------------------------------- */

/* The calls in a choice's whole output as OpenAI's tool_calls array (with
 * "index" for stream deltas), or NULL for a plain answer; *content gets
 * the rest of the text (malloc'd). */
static cJSON *tool_calls_json(srv_choice *c, bool with_index, char **content) {
    srv *s = c->req->s;
    cmf_tool_calls tc = {0};
    cmf_error err;
    *content = NULL;
    if (cmf_tool_calls_parse(s->fam, c->text ? c->text : "", c->len, &tc, &err) != CMF_OK || tc.n == 0) {
        cmf_tool_calls_free(&tc);
        return NULL;
    }
    cJSON *a = cJSON_CreateArray();
    for (size_t i = 0; a && i < tc.n; i++) {
        cJSON *o = cJSON_CreateObject(), *fn;
        if (with_index) cJSON_AddNumberToObject(o, "index", (double)i);
        cJSON_AddStringToObject(o, "id", tc.calls[i].id);
        cJSON_AddStringToObject(o, "type", "function");
        fn = cJSON_AddObjectToObject(o, "function");
        cJSON_AddStringToObject(fn, "name", tc.calls[i].name);
        cJSON_AddStringToObject(fn, "arguments", tc.calls[i].arguments);
        cJSON_AddItemToArray(a, o);
    }
    *content = tc.content ? strdup(tc.content) : NULL;
    cmf_tool_calls_free(&tc);
    return a;
}

/* ---- answers ------------------------------------------------------------- */

static const char *finish_reason(const srv_choice *c) {
    return c->stop == CMF_STOP_MAX_TOKENS || c->stop == CMF_STOP_CONTEXT_FULL ? "length" : "stop";
}

static cJSON *chunk_base(srv_req *r) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", r->id);
    cJSON_AddStringToObject(o, "object", r->gen->chat ? "chat.completion.chunk" : "text_completion");
    cJSON_AddNumberToObject(o, "created", (double)r->created);
    cJSON_AddStringToObject(o, "model", r->gen->model);
    return o;
}

static void usage_obj(srv_req *r, cJSON *o) {
    size_t pt = 0, ct = 0;
    for (size_t i = 0; i < r->gen->n_prompts; i++) pt += r->gen->n_prompt[i];
    for (size_t i = 0; i < r->n_choices; i++) ct += r->choices[i].n_gen;
    cJSON *u = cJSON_AddObjectToObject(o, "usage");
    cJSON_AddNumberToObject(u, "prompt_tokens", (double)pt);
    cJSON_AddNumberToObject(u, "completion_tokens", (double)ct);
    cJSON_AddNumberToObject(u, "total_tokens", (double)(pt + ct));
}

static void send_event(srv_req *r, cJSON *o) {
    char *t = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (!t) return;
    srv_out_append(r, "data: ", 6);
    srv_out_append(r, t, strlen(t));
    srv_out_append(r, "\n\n", 2);
    cJSON_free(t);
}

/* One stream chunk of choice c: delta text, logprobs, finish_reason (or
 * the role, for the first chat chunk). */
static void stream_chunk(srv_choice *c, const char *text, size_t len, const char *finish, bool role) {
    srv_req *r = c->req;
    cJSON *o = chunk_base(r), *chs = cJSON_AddArrayToObject(o, "choices"), *ch = cJSON_CreateObject();
    cJSON_AddNumberToObject(ch, "index", c->index);
    char *t = malloc(len + 1);
    if (t) { memcpy(t, text, len); t[len] = 0; }
    if (r->gen->chat) {
        cJSON *d = cJSON_AddObjectToObject(ch, "delta");
        if (role) cJSON_AddStringToObject(d, "role", "assistant");
        if (role || len) cJSON_AddStringToObject(d, "content", t ? t : "");
    } else {
        cJSON_AddStringToObject(ch, "text", t ? t : "");
    }
    free(t);
    cJSON *lp = take_lp_chunk(c);
    if (lp) cJSON_AddItemToObject(ch, "logprobs", lp);
    else cJSON_AddNullToObject(ch, "logprobs");
    if (finish) cJSON_AddStringToObject(ch, "finish_reason", finish);
    else cJSON_AddNullToObject(ch, "finish_reason");
    cJSON_AddItemToArray(chs, ch);
    if (r->gen->include_usage) cJSON_AddNullToObject(o, "usage");
    send_event(r, o);
}

/* The end of a streamed choice with tools: the calls as deltas (each with
 * its index) and finish_reason "tool_calls", or the held-back text. */
static void stream_tools_end(srv_choice *c) {
    srv_req *r = c->req;
    char *content = NULL;
    cJSON *calls = tool_calls_json(c, true, &content);
    free(content);
    if (!calls) {
        stream_chunk(c, c->text ? c->text + c->emitted : "", c->len - c->emitted, finish_reason(c), false);
        return;
    }
    cJSON *e;
    while ((e = cJSON_DetachItemFromArray(calls, 0))) {
        cJSON *o = chunk_base(r), *chs = cJSON_AddArrayToObject(o, "choices"), *ch = cJSON_CreateObject();
        cJSON_AddNumberToObject(ch, "index", c->index);
        cJSON *d = cJSON_AddObjectToObject(ch, "delta"), *tc = cJSON_AddArrayToObject(d, "tool_calls");
        cJSON_AddItemToArray(tc, e);
        cJSON_AddNullToObject(ch, "logprobs");
        cJSON_AddNullToObject(ch, "finish_reason");
        cJSON_AddItemToArray(chs, ch);
        if (r->gen->include_usage) cJSON_AddNullToObject(o, "usage");
        send_event(r, o);
    }
    cJSON_Delete(calls);
    stream_chunk(c, "", 0, "tool_calls", false);
}

static void stream_error(srv_req *r, unsigned status, const char *msg) {
    char *e = srv_error_json(status, NULL, msg);
    if (e) {
        srv_out_printf(r, "data: %s\n\n", e);
        free(e);
    }
}

/* All choices are done: the stream's tail, or the whole answer. */
static void finish_request(srv_req *r) {
    srv *s = r->s;
    const srv_choice *err = NULL;
    for (size_t i = 0; i < r->n_choices; i++)
        if (r->choices[i].status != CMF_OK || (r->choices[i].stop == CMF_STOP_CALLBACK && !r->conn_gone))
            err = &r->choices[i];
    if (r->gen->stream) {
        if (r->gen->include_usage) {
            cJSON *o = chunk_base(r);
            cJSON_AddArrayToObject(o, "choices");
            usage_obj(r, o);
            send_event(r, o);
        }
        srv_out_append(r, "data: [DONE]\n\n", 14);
        r->finished = true;
        return;
    }
    r->queued_response = true;
    if (err) {
        char *e = srv_error_json(500, NULL, err->errmsg ? err->errmsg : "the generation was cancelled");
        free(r->out);
        r->out = e;
        r->out_len = e ? strlen(e) : 0;
        r->answer_status = 500;
        return;
    }
    cJSON *o = cJSON_CreateObject(), *chs;
    cJSON_AddStringToObject(o, "id", r->id);
    cJSON_AddStringToObject(o, "object", r->gen->chat ? "chat.completion" : "text_completion");
    cJSON_AddNumberToObject(o, "created", (double)r->created);
    cJSON_AddStringToObject(o, "model", r->gen->model);
    chs = cJSON_AddArrayToObject(o, "choices");
    for (size_t i = 0; i < r->n_choices; i++) {
        srv_choice *c = &r->choices[i];
        cJSON *ch = cJSON_CreateObject();
        cJSON_AddNumberToObject(ch, "index", c->index);
        char *content = NULL;
        cJSON *calls = r->gen->tools ? tool_calls_json(c, false, &content) : NULL;
        if (r->gen->chat) {
            cJSON *m = cJSON_AddObjectToObject(ch, "message");
            cJSON_AddStringToObject(m, "role", "assistant");
            if (calls && (!content || !content[0])) cJSON_AddNullToObject(m, "content");
            else cJSON_AddStringToObject(m, "content", calls ? content : c->text ? c->text : "");
            if (calls) cJSON_AddItemToObject(m, "tool_calls", calls);
            free(content);
        } else {
            cJSON_AddStringToObject(ch, "text", c->text ? c->text : "");
        }
        if (c->logprobs) {
            if (r->gen->chat) {
                cJSON *lo = cJSON_CreateObject();
                cJSON_AddItemToObject(lo, "content", c->logprobs);
                cJSON_AddItemToObject(ch, "logprobs", lo);
            } else {
                cJSON_AddItemToObject(ch, "logprobs", c->logprobs);
            }
            c->logprobs = NULL;
        } else {
            cJSON_AddNullToObject(ch, "logprobs");
        }
        cJSON_AddStringToObject(ch, "finish_reason", calls ? "tool_calls" : finish_reason(c));
        cJSON_AddItemToArray(chs, ch);
    }
    usage_obj(r, o);
    char *t = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    free(r->out);
    r->out = t;
    r->out_len = t ? strlen(t) : 0;
    r->answer_status = t ? 200 : 500;
    (void)s;
}

static void unlink_live(srv_req *r) {
    srv *s = r->s;
    if (r->prev_live) r->prev_live->next_live = r->next_live;
    else if (s->live == r) s->live = r->next_live;
    if (r->next_live) r->next_live->prev_live = r->prev_live;
    r->next_live = r->prev_live = NULL;
}

static bool on_event(const cmf_seq_event *ev, void *user) {
    srv_choice *c = user;
    srv_req *r = c->req;
    srv *s = r->s;
    double now = srv_now();
    pthread_mutex_lock(&s->mu);
    bool stream = r->gen->stream, talk = !r->conn_gone && !r->client_hup;
    if (ev->token >= 0) {
        s->m.gen_tokens++;
        s->m.device_sampled += !ev->logits;
        c->n_gen = ev->n_generated;
        if (!r->any_token) {
            r->any_token = true;
            srv_hist_add(&s->m.ttft, now - r->t0);
        }
        if (c->started) srv_hist_add(&s->m.itl, now - c->t_last);
        c->started = true;
        c->t_last = now;
        bool is_eos = !ev->done && ev->stop == CMF_STOP_EOS;
        if (r->gen->logprobs && ev->logits && !is_eos) add_logprobs(c, ev, ev->text, ev->len);
    }
    if (ev->len) {
        if (c->len + ev->len + 1 > c->cap) {
            size_t cap = c->cap ? c->cap * 2 : 256;
            while (cap < c->len + ev->len + 1) cap *= 2;
            char *p = realloc(c->text, cap);
            if (p) { c->text = p; c->cap = cap; }
        }
        if (c->len + ev->len + 1 <= c->cap) {
            memcpy(c->text + c->len, ev->text, ev->len);
            c->len += ev->len;
            c->text[c->len] = 0;
        }
    }
    if (stream && talk && !ev->done && r->gen->tools) { /* hold back what may become a call */
        size_t pre = cmf_tool_calls_content_prefix(s->fam, c->text ? c->text : "", c->len, NULL);
        if (pre < c->emitted) pre = c->emitted;
        if (pre > c->emitted || c->lp_chunk) stream_chunk(c, c->text + c->emitted, pre - c->emitted, NULL, false);
        c->emitted = pre;
    } else if (stream && talk && !ev->done && (ev->len || c->lp_chunk)) {
        stream_chunk(c, ev->text, ev->len, NULL, false);
    }
    if (!stream) merge_lp(c);
    if (ev->done) {
        c->done = true;
        c->live = false;
        c->stop = ev->stop;
        c->status = ev->status;
        if (ev->status != CMF_OK) c->errmsg = strdup(ev->msg ? ev->msg : cmf_status_name(ev->status));
        r->n_done++;
        assert(s->in_flight > 0);
        s->in_flight--;
        if (stream && talk) {
            if (c->status != CMF_OK) stream_error(r, 500, c->errmsg ? c->errmsg : "generation failed");
            else if (c->stop == CMF_STOP_CALLBACK) stream_error(r, 503, "the request was cancelled (server shutting down)");
            else if (r->gen->tools) stream_tools_end(c);
            else stream_chunk(c, ev->text, ev->len, finish_reason(c), false);
        }
        if (r->n_done == r->n_choices) {
            if (talk) finish_request(r);
            else r->finished = true;
            if (r->counted && r->key >= 0 && s->o.per_key && s->per_key[r->key] > 0) s->per_key[r->key]--;
            unlink_live(r);
            srv_hist_add(&s->m.e2e, now - r->t0);
        }
    }
    bool go = !r->conn_gone && !r->client_hup;
    /* a stream wakes for every chunk; a whole answer only once it is ready
     * (or abandoned): it stays suspended meanwhile, so that poll_clients
     * keeps watching its socket for a hang-up */
    bool wake = (stream || r->queued_response || r->finished) && srv_wake_take(r);
    struct MHD_Connection *wc = wake ? r->conn : NULL;
    if (wc && ev->done && s->in_step && s->n_wake_after_step < sizeof s->wake_after_step / sizeof s->wake_after_step[0]) {
        s->wake_after_step[s->n_wake_after_step++] = wc; /* srv_engine_loop resumes it after the step */
        wc = NULL;
    }
    if (ev->done) srv_req_unref(r); /* the sequence's reference (r stays alive while suspended) */
    pthread_mutex_unlock(&s->mu);
    if (wc) srv_resume_conn(wc);
    return go;
}

/* ---- submit (HTTP thread, under s->mu) ---------------------------------- */

unsigned srv_gen_submit(srv_req *r, char *msg, size_t cap) {
    srv *s = r->s;
    srv_gen *g = r->gen;
    size_t total = g->n_prompts * g->n;
    if (s->stopping) { snprintf(msg, cap, "the server is shutting down"); return 503; }
    if (s->in_flight + total > (size_t)s->o.parallel + s->o.queue) {
        snprintf(msg, cap, "the server is busy (%u sequences running or queued, %u allowed); retry later",
                 s->in_flight, s->o.parallel + s->o.queue);
        return 429;
    }
    if (s->o.per_key && r->key >= 0 && s->per_key[r->key] >= s->o.per_key) {
        snprintf(msg, cap, "this API key has %u requests in flight (--max-per-key %u); retry later",
                 s->per_key[r->key], s->o.per_key);
        return 429;
    }
    r->choices = calloc(total, sizeof *r->choices);
    if (!r->choices) { snprintf(msg, cap, "out of memory"); return 500; }
    r->n_choices = total;
    r->created = (long)time(NULL);
    snprintf(r->id, sizeof r->id, "%s-%llx%04llx", g->chat ? "chatcmpl" : "cmpl", (unsigned long long)r->created,
             (unsigned long long)(s->next_req++ & 0xffff));
    for (size_t p = 0, i = 0; p < g->n_prompts; p++) {
        s->m.prompt_tokens += g->n_prompt[p];
        for (uint32_t j = 0; j < g->n; j++, i++) {
            srv_choice *c = &r->choices[i];
            c->req = r;
            c->index = (uint32_t)i;
            cmf_seq_params sp = {.prompt = g->prompts[p], .n_prompt = g->n_prompt[p], .sampler = g->sampler,
                                 .n_predict = g->max_tokens, .eos_ids = g->eos, .n_eos = g->n_eos,
                                 .stop_strings = (const char *const *)g->stops, .n_stop = g->n_stop,
                                 .weight_set = g->weight_set, .grammar = g->grammar, .no_draft = g->no_draft,
                                 .want_logits = g->logprobs, .cb = on_event, .user = c};
            if (g->sampler.has_seed) sp.sampler.seed = g->sampler.seed + j; /* choice j of n: its own draw */
            cmf_error err = {0};
            c->live = true;
            r->refs++;
            s->in_flight++;
            if (cmf_engine_add(s->eng, &sp, &c->seq_id, &err) != CMF_OK) {
                c->live = false;
                r->refs--;
                s->in_flight--;
                for (size_t k = 0; k < i; k++) cmf_engine_cancel(s->eng, r->choices[k].seq_id);
                r->client_hup = true; /* the answer is this error; the cancelled ones only clean up */
                r->n_choices = i;
                snprintf(msg, cap, "%s", err.msg);
                return err.status == CMF_ERR_NOMEM ? 500 : 400;
            }
        }
    }
    r->counted = true;
    if (s->o.per_key && r->key >= 0) s->per_key[r->key]++;
    r->next_live = s->live;
    if (s->live) s->live->prev_live = r;
    s->live = r;
    r->t_last_ping = srv_now();
    if (g->stream && g->chat)
        for (size_t i = 0; i < r->n_choices; i++) stream_chunk(&r->choices[i], "", 0, NULL, true);
    return 0;
}

/* ---- the engine thread ----------------------------------------------------- */

/* Hang-ups and pings of suspended connections (under s->mu). Cancels the
 * sequences of a client that closed its socket and wakes the connection
 * so that MHD closes it.
 *
 * A peer's FIN (POLLRDHUP) alone does not tell a client that closed its
 * socket from one that only shut its sending side (shutdown(SHUT_WR)
 * after a whole request) and still reads: the first time, the socket is
 * probed with a write (an SSE ": ping" comment; for a whole answer over
 * HTTP/1.1 an interim "100 Continue", which every client must accept
 * before the final answer, RFC 9110 15.2). A closed peer answers the
 * write with a reset, seen as POLLERR/POLLHUP at the next step; a
 * half-closed one reads it and gets its answer. Over HTTP/1.0 (no 1xx)
 * the FIN counts as a hang-up. */
static bool peer_gone(srv_req *r, bool *ping) {
    struct pollfd pf = {.fd = r->fd, .events = POLLRDHUP};
    if (poll(&pf, 1, 0) <= 0) return false;
    if (pf.revents & (POLLHUP | POLLERR)) return true;
    if (!(pf.revents & POLLRDHUP) || r->probed) return false;
    r->probed = true;
    if (r->gen && r->gen->stream) {
        *ping = true;
        return false;
    }
    if (!r->http11) return true;
    static const char cont[] = "HTTP/1.1 100 Continue\r\n\r\n";
    /* the connection is suspended until the answer is ready: MHD writes nothing to it meanwhile */
    return send(r->fd, cont, sizeof cont - 1, MSG_NOSIGNAL | MSG_DONTWAIT) != (ssize_t)(sizeof cont - 1);
}

static void poll_clients(srv *s, struct MHD_Connection **wake, size_t *n_wake, size_t cap) {
    double now = srv_now();
    for (srv_req *r = s->live; r; r = r->next_live) {
        if (r->conn_gone || r->client_hup || !r->suspended || r->fd < 0) continue;
        bool ping = false;
        if (peer_gone(r, &ping)) {
            r->client_hup = true;
            s->m.cancelled++;
            for (size_t i = 0; i < r->n_choices; i++)
                if (r->choices[i].live) cmf_engine_cancel(s->eng, r->choices[i].seq_id);
            if (*n_wake < cap && srv_wake_take(r)) wake[(*n_wake)++] = r->conn;
            continue;
        }
        if (ping || (r->gen && r->gen->stream && !r->any_token && now - r->t_last_ping >= s->o.ping_s)) {
            r->t_last_ping = now;
            srv_out_append(r, ": ping\n\n", 8);
            if (*n_wake < cap && srv_wake_take(r)) wake[(*n_wake)++] = r->conn;
        }
    }
}

/* Moves the connections of requests that ended in the last step (see
 * srv.wake_after_step) to wake[]; under s->mu. */
static void take_wake_after_step(srv *s, struct MHD_Connection **wake, size_t *n_wake, size_t cap) {
    size_t k = 0;
    for (; k < s->n_wake_after_step && *n_wake < cap; k++) wake[(*n_wake)++] = s->wake_after_step[k];
    memmove(s->wake_after_step, s->wake_after_step + k, (s->n_wake_after_step - k) * sizeof s->wake_after_step[0]);
    s->n_wake_after_step -= k;
}

void srv_engine_loop(srv *s) {
    struct MHD_Connection *wake[256];
    while (!(s->o.should_stop && s->o.should_stop(s->o.stop_user))) {
        pthread_mutex_lock(&s->mu);
        srv_embed *jobs = s->embed_head;
        s->embed_head = s->embed_tail = NULL;
        size_t n_wake = 0;
        poll_clients(s, wake, &n_wake, sizeof wake / sizeof wake[0]);
        take_wake_after_step(s, wake, &n_wake, sizeof wake / sizeof wake[0]); /* ended outside a step */
        pthread_mutex_unlock(&s->mu);
        for (size_t i = 0; i < n_wake; i++) srv_resume_conn(wake[i]);
        while (jobs) {
            srv_embed *nx = jobs->next;
            srv_embed_run(s, jobs);
            jobs = nx;
        }
        srv_ws_jobs_run(s); /* overlays requests wait for (the HTTP thread is blocked on them) */
        if (!cmf_engine_wait(s->eng, 20)) continue;
        cmf_engine_step_info info = {0};
        cmf_error err = {0};
        pthread_mutex_lock(&s->mu);
        s->in_step = true;
        pthread_mutex_unlock(&s->mu);
        cmf_status st = cmf_engine_step(s->eng, &info, &err);
        pthread_mutex_lock(&s->mu);
        s->in_step = false;
        s->m.steps++;
        s->m.running = info.n_running;
        s->m.waiting = info.n_waiting;
        cmf_kv_get_stats(cmf_engine_kv(s->eng), &s->m.kv);
        cmf_engine_get_spec_stats(s->eng, &s->m.spec);
        n_wake = 0;
        take_wake_after_step(s, wake, &n_wake, sizeof wake / sizeof wake[0]);
        pthread_mutex_unlock(&s->mu);
        for (size_t i = 0; i < n_wake; i++) srv_resume_conn(wake[i]);
        if (st != CMF_OK) {
            FILE *log = s->o.log ? s->o.log : stderr;
            fprintf(log, "cmf serve: engine step failed: %s\n", err.msg);
        }
    }
}

/* Shutdown: end every sequence (their clients get an error event or a
 * 503), answer queued embeddings, wake every suspended connection. */
void srv_shutdown_requests(srv *s) {
    pthread_mutex_lock(&s->mu);
    s->stopping = true;
    pthread_cond_broadcast(&s->ws_cv); /* overlay waiters answer 503 */
    for (srv_req *r = s->live; r; r = r->next_live)
        for (size_t i = 0; i < r->n_choices; i++)
            if (r->choices[i].live) cmf_engine_cancel(s->eng, r->choices[i].seq_id);
    srv_embed *jobs = s->embed_head;
    s->embed_head = s->embed_tail = NULL;
    pthread_mutex_unlock(&s->mu);
    while (jobs) {
        srv_embed *nx = jobs->next;
        srv_embed_run(s, jobs); /* quick: answers them */
        jobs = nx;
    }
    double t0 = srv_now();
    while (s->eng && !cmf_engine_idle(s->eng) && srv_now() - t0 < 10.0) {
        cmf_error err;
        cmf_engine_step(s->eng, NULL, &err);
    }
    /* give MHD a moment to send what is left */
    for (int i = 0; i < 50; i++) {
        pthread_mutex_lock(&s->mu);
        bool any = s->live != NULL;
        pthread_mutex_unlock(&s->mu);
        if (!any) break;
        struct timespec ts = {0, 20 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}
