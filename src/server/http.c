/*
 * http.c — the HTTP layer of `cmf serve` on libmicrohttpd: one internal
 * polling thread for every connection (no thread per connection), the
 * request life cycle (headers, body, answer), the safe defaults (API keys
 * on every path but /health, checked before routing, as a Bearer token or a Basic password, the
 * Host check on loopback binds against DNS rebinding, CORS only with
 * --cors, a body limit answered 413, at once for a declared Content-Length), SSE streaming through a content
 * reader that suspends the connection while it has nothing to send and is
 * resumed by the engine thread (gen.c) as tokens arrive, one log line per
 * request, and cmf_server_run: bind first (so /health says 503 while the
 * model loads), load, step the engine, shut down cleanly.
 */

#include "server/server.h"

#include <microhttpd.h>
#include <sodium.h>

#include <arpa/inet.h>
#include <assert.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

double srv_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

bool srv_out_append(srv_req *r, const char *data, size_t len) {
    if (r->out_len + len + 1 > r->out_cap) {
        size_t cap = r->out_cap ? r->out_cap : 1024;
        while (cap < r->out_len + len + 1) cap *= 2;
        char *p = realloc(r->out, cap);
        if (!p) return false;
        r->out = p;
        r->out_cap = cap;
    }
    memcpy(r->out + r->out_len, data, len);
    r->out_len += len;
    r->out[r->out_len] = 0;
    return true;
}

bool srv_out_printf(srv_req *r, const char *fmt, ...) {
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (n < 0) return false;
    if ((size_t)n < sizeof buf) return srv_out_append(r, buf, (size_t)n);
    char *big = malloc((size_t)n + 1);
    if (!big) return false;
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    bool ok = srv_out_append(r, big, (size_t)n);
    free(big);
    return ok;
}

bool srv_wake_take(srv_req *r) {
    if (!r->suspended || r->conn_gone) return false;
    r->suspended = false;
    return true;
}

void srv_resume_conn(struct MHD_Connection *c) { MHD_resume_connection(c); }

static void req_free(srv_req *r) {
    if (r->gen) {
        srv_gen_free(r->gen);
        free(r->gen);
    }
    for (size_t i = 0; i < r->n_choices; i++) {
        free(r->choices[i].text);
        free(r->choices[i].errmsg);
        cJSON_Delete(r->choices[i].logprobs);
        cJSON_Delete(r->choices[i].lp_chunk);
    }
    free(r->choices);
    free(r->body);
    free(r->out);
    free(r);
}

void srv_req_unref(srv_req *r) {
    assert(r->refs > 0);
    if (--r->refs == 0) req_free(r);
}

/* ---- auth, Host, CORS ------------------------------------------------- */

/* Constant-time comparison (the length leaks, the content does not). */
static bool key_eq(const char *a, size_t la, const char *b) {
    size_t lb = strlen(b);
    unsigned char d = (unsigned char)(la != lb);
    for (size_t i = 0; i < la && i < lb; i++) d |= (unsigned char)(a[i] ^ b[i]);
    return d == 0;
}

/* The index of the key the request carries (Bearer KEY, or Basic with KEY
 * as the password), -1 without a valid one. */
static int find_key(srv *s, struct MHD_Connection *c) {
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (!h) return -1;
    const char *tok = NULL;
    size_t tl = 0;
    char dec[1024];
    if (strncasecmp(h, "Bearer ", 7) == 0) {
        tok = h + 7;
        while (*tok == ' ') tok++;
        tl = strlen(tok);
        while (tl && tok[tl - 1] == ' ') tl--;
    } else if (strncasecmp(h, "Basic ", 6) == 0) {
        size_t bl = 0;
        if (sodium_base642bin((unsigned char *)dec, sizeof dec - 1, h + 6, strlen(h + 6), " ", &bl, NULL,
                              sodium_base64_VARIANT_ORIGINAL) != 0)
            return -1;
        dec[bl] = 0;
        char *colon = memchr(dec, ':', bl);
        if (!colon) return -1;
        tok = colon + 1;
        tl = bl - (size_t)(tok - dec);
    } else {
        return -1;
    }
    int found = -1;
    for (size_t i = 0; i < s->o.n_api_keys; i++) /* no early exit: constant time over keys */
        if (key_eq(tok, tl, s->o.api_keys[i]) && found < 0) found = (int)i;
    return found;
}

/* Loopback binds accept only Host: localhost, 127.0.0.1 or [::1] (any
 * port): a page from another site resolved to 127.0.0.1 (DNS rebinding)
 * names its own host. */
static bool host_ok(srv *s, struct MHD_Connection *c) {
    if (!s->loopback) return true;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_HOST);
    if (!h) return true; /* HTTP/1.0 without Host: not a browser */
    size_t n = strlen(h);
    const char *colon = h[0] == '[' ? strchr(h, ']') : strchr(h, ':');
    if (h[0] == '[') {
        if (!colon) return false;
        n = (size_t)(colon - h) + 1;
        if (colon[1] && colon[1] != ':') return false;
    } else if (colon) {
        n = (size_t)(colon - h);
    }
    if (colon && h[0] != '[') {
        for (const char *p = colon + 1; *p; p++)
            if (*p < '0' || *p > '9') return false;
    }
    return (n == 9 && strncasecmp(h, "localhost", 9) == 0) || (n == 9 && strncmp(h, "127.0.0.1", 9) == 0) ||
           (n == 5 && strncmp(h, "[::1]", 5) == 0);
}

static void add_cors(srv *s, struct MHD_Connection *c, struct MHD_Response *resp) {
    if (!s->o.cors_origin) return;
    const char *origin = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Origin");
    if (!origin) return;
    if (strcmp(s->o.cors_origin, "*") != 0 && strcmp(s->o.cors_origin, origin) != 0) return;
    MHD_add_response_header(resp, "Access-Control-Allow-Origin", s->o.cors_origin);
    MHD_add_response_header(resp, "Vary", "Origin");
}

/* ---- answers ------------------------------------------------------------- */

static enum MHD_Result answer(srv_req *r, unsigned status, char *body, size_t len, const char *ctype,
                              int retry_after) {
    struct MHD_Response *resp = MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE);
    if (!resp) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, ctype);
    if (status == 401) MHD_add_response_header(resp, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Basic realm=\"cmf\"");
    if (retry_after > 0) {
        char ra[16];
        snprintf(ra, sizeof ra, "%d", retry_after);
        MHD_add_response_header(resp, MHD_HTTP_HEADER_RETRY_AFTER, ra);
    }
    add_cors(r->s, r->conn, resp);
    r->status = status;
    r->bytes_out = len;
    enum MHD_Result ok = MHD_queue_response(r->conn, status, resp);
    MHD_destroy_response(resp);
    return ok;
}

static enum MHD_Result answer_error(srv_req *r, unsigned status, const char *param, const char *msg) {
    char *b = srv_error_json(status, param, msg);
    if (!b) return MHD_NO;
    return answer(r, status, b, strlen(b), "application/json", status == 429 ? 1 : 0);
}

/* SSE: copy what the engine wrote; nothing yet: suspend until it resumes us. */
static ssize_t sse_reader(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    srv_req *r = cls;
    srv *s = r->s;
    pthread_mutex_lock(&s->mu);
    ssize_t n;
    if (r->out_sent < r->out_len) {
        size_t k = r->out_len - r->out_sent;
        if (k > max) k = max;
        memcpy(buf, r->out + r->out_sent, k);
        r->out_sent += k;
        r->bytes_out += k;
        if (r->out_sent == r->out_len) r->out_sent = r->out_len = 0; /* reuse the buffer */
        n = (ssize_t)k;
    } else if (r->finished) {
        n = MHD_CONTENT_READER_END_OF_STREAM;
    } else if (r->client_hup || s->stopping) {
        n = MHD_CONTENT_READER_END_WITH_ERROR;
    } else {
        r->suspended = true;
        MHD_suspend_connection(r->conn); /* our own thread: allowed from a content reader */
        n = 0;
    }
    pthread_mutex_unlock(&s->mu);
    return n;
}

static void sse_free(void *cls) {
    srv_req *r = cls;
    srv *s = r->s; /* r may be freed by the unref */
    pthread_mutex_lock(&s->mu);
    srv_req_unref(r); /* the response's reference */
    pthread_mutex_unlock(&s->mu);
}

static enum MHD_Result answer_stream(srv_req *r) {
    struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, sse_reader, r, sse_free);
    if (!resp) return MHD_NO;
    r->refs++; /* under s->mu by the caller */
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    add_cors(r->s, r->conn, resp);
    r->status = 200;
    enum MHD_Result ok = MHD_queue_response(r->conn, 200, resp);
    MHD_destroy_response(resp);
    return ok;
}

/* libmicrohttpd's own messages (MHD_USE_ERROR_LOG) into the server's log,
 * named as its: a bare "Application reported internal error, closing
 * connection." read as cmf's. That one is what libmicrohttpd says when the
 * request handler closes the connection of a client that already left (a
 * cancelled request), so it is reworded. */
static void mhd_log(void *cls, const char *fmt, va_list ap) {
    const srv *s = cls;
    FILE *log = s->o.log ? s->o.log : stderr;
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    size_t n = strlen(msg);
    while (n && (msg[n - 1] == '\n' || msg[n - 1] == '\r')) msg[--n] = 0;
    if (strncmp(msg, "Application reported internal error", 35) == 0)
        snprintf(msg, sizeof msg, "a connection closed (its client had left, or the request could not be answered)");
    fprintf(log, "cmf serve: libmicrohttpd: %s\n", msg);
}

#define SRV_CONN_PER_IP 256 /* connections one client address may hold (not on loopback binds) */

/* ---- routing ---------------------------------------------------------- */

static srv_route route_of(const char *url, const char *method, bool *method_ok) {
    static const struct { const char *path, *method; srv_route r; } table[] = {
        {"/v1/chat/completions", "POST", R_CHAT}, {"/chat/completions", "POST", R_CHAT},
        {"/v1/completions", "POST", R_COMPLETIONS}, {"/completions", "POST", R_COMPLETIONS},
        {"/v1/embeddings", "POST", R_EMBEDDINGS}, {"/embeddings", "POST", R_EMBEDDINGS},
        {"/v1/models", "GET", R_MODELS}, {"/models", "GET", R_MODELS},
        {"/health", "GET", R_HEALTH}, {"/metrics", "GET", R_METRICS},
        {"/tokenize", "POST", R_TOKENIZE}, {"/detokenize", "POST", R_DETOKENIZE},
        {"/v1/status", "GET", R_STATUS}, {"/", "GET", R_PAGE}, {"/index.html", "GET", R_PAGE},
    };
    *method_ok = true;
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
        if (strcmp(url, table[i].path) != 0) continue;
        if (strcmp(method, "OPTIONS") == 0) return R_OPTIONS;
        if (strcmp(method, table[i].method) == 0 || (strcmp(method, "HEAD") == 0 && table[i].method[0] == 'G'))
            return table[i].r;
        *method_ok = false;
        return table[i].r;
    }
    /* /v1/models/{id} (OpenAI's models.retrieve) */
    const char *pre = strncmp(url, "/v1/models/", 11) == 0 ? url + 11 : strncmp(url, "/models/", 8) == 0 ? url + 8 : NULL;
    if (pre && *pre) {
        if (strcmp(method, "OPTIONS") == 0) return R_OPTIONS;
        *method_ok = strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0;
        return R_MODEL;
    }
    return R_NONE;
}

static enum MHD_Result handle_final(srv_req *r) {
    srv *s = r->s;
    char msg[512];
    if (r->too_big) {
        snprintf(msg, sizeof msg, "the request body exceeds %zu bytes (--max-body)", s->o.max_body);
        return answer_error(r, 413, NULL, msg);
    }
    cJSON *body = NULL;
    if (r->route == R_CHAT || r->route == R_COMPLETIONS || r->route == R_EMBEDDINGS || r->route == R_TOKENIZE ||
        r->route == R_DETOKENIZE) {
        if (r->body) r->body[r->body_len] = 0;
        body = srv_json_parse(r->body, r->body_len, msg, sizeof msg);
        if (!body) return answer_error(r, 400, NULL, msg);
        if (!cJSON_IsObject(body)) {
            cJSON_Delete(body);
            return answer_error(r, 400, NULL, "the request body must be a JSON object");
        }
    }
    if (r->route == R_CHAT || r->route == R_COMPLETIONS) {
        srv_gen *g = calloc(1, sizeof *g);
        const char *param = NULL;
        if (!g) { cJSON_Delete(body); return answer_error(r, 500, NULL, "out of memory"); }
        unsigned st = srv_gen_parse(s, body, r->route == R_CHAT, g, msg, sizeof msg, &param);
        cJSON_Delete(body);
        if (st) {
            srv_gen_free(g);
            free(g);
            return answer_error(r, st, param, msg);
        }
        r->gen = g;
        pthread_mutex_lock(&s->mu);
        st = srv_gen_submit(r, msg, sizeof msg);
        if (st) {
            if (st == 429) s->m.rejected_429++;
            pthread_mutex_unlock(&s->mu);
            return answer_error(r, st, NULL, msg);
        }
        enum MHD_Result ok;
        if (g->stream) {
            ok = answer_stream(r);
        } else {
            r->suspended = true;
            MHD_suspend_connection(r->conn);
            ok = MHD_YES;
        }
        pthread_mutex_unlock(&s->mu);
        return ok;
    }
    char *out = NULL;
    const char *ctype = "application/json";
    unsigned st = srv_route_simple(r, body, &out, &ctype);
    cJSON_Delete(body);
    if (st == 0) { /* embeddings: queued; the engine thread resumes us */
        return MHD_YES;
    }
    if (!out) return answer_error(r, 500, NULL, "out of memory");
    if (st >= 400 && strcmp(ctype, "application/json") == 0 && strncmp(out, "{\"error\"", 8) != 0) {
        char *e = srv_error_json(st, NULL, out);
        free(out);
        if (!e) return MHD_NO;
        out = e;
    }
    return answer(r, st, out, strlen(out), ctype, 0);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **ctx) {
    srv *s = cls;
    srv_req *r = *ctx;
    if (!r) {
        r = calloc(1, sizeof *r);
        if (!r) return MHD_NO;
        r->s = s;
        r->conn = c;
        r->refs = 1;
        r->key = -1;
        r->fd = -1;
        r->t0 = srv_now();
        r->http11 = version && strcmp(version, MHD_HTTP_VERSION_1_1) == 0;
        snprintf(r->method, sizeof r->method, "%s", method);
        snprintf(r->path, sizeof r->path, "%s", url);
        *ctx = r;
        bool method_ok;
        r->route = route_of(url, method, &method_ok);
        if (r->http11 && !MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_HOST))
            return answer_error(r, 400, NULL, "an HTTP/1.1 request must carry a Host header (RFC 9112, 3.2)");
        if (!host_ok(s, c)) return answer_error(r, 403, NULL, "the Host header names another site (DNS rebinding guard)");
        if (r->route == R_OPTIONS) {
            if (!s->o.cors_origin) return answer_error(r, 405, NULL, "CORS is off (start the server with --cors ORIGIN)");
            char *e = calloc(1, 1);
            if (!e) return MHD_NO;
            struct MHD_Response *resp = MHD_create_response_from_buffer(0, e, MHD_RESPMEM_MUST_FREE);
            if (!resp) { free(e); return MHD_NO; }
            add_cors(s, c, resp);
            MHD_add_response_header(resp, "Access-Control-Allow-Methods", "GET, POST, OPTIONS");
            MHD_add_response_header(resp, "Access-Control-Allow-Headers", "Authorization, Content-Type");
            MHD_add_response_header(resp, "Access-Control-Max-Age", "600");
            r->status = 204;
            enum MHD_Result ok = MHD_queue_response(c, 204, resp);
            MHD_destroy_response(resp);
            return ok;
        }
        /* auth before routing: without a key, every path but /health is 401
         * (an unknown one too: the routes are not probed) */
        if (r->route != R_HEALTH && s->o.n_api_keys > 0) {
            r->key = find_key(s, c);
            if (r->key < 0) return answer_error(r, 401, NULL, "a valid API key is required (Authorization: Bearer KEY)");
        }
        if (r->route == R_NONE) return answer_error(r, 404, NULL, "no such route");
        if (!method_ok) return answer_error(r, 405, NULL, "method not allowed on this route");
        pthread_mutex_lock(&s->mu);
        bool loading = s->loading;
        pthread_mutex_unlock(&s->mu);
        if (loading && r->route != R_HEALTH) return answer_error(r, 503, NULL, "the model is loading");
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl && strtoull(cl, NULL, 10) > s->o.max_body) { /* answered before the body is read */
            r->too_big = true;
            char msg[160];
            snprintf(msg, sizeof msg, "the request body (Content-Length %s) exceeds %zu bytes (--max-body)", cl,
                     s->o.max_body);
            return answer_error(r, 413, NULL, msg);
        }
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        r->fd = ci ? ci->connect_fd : -1;
        return MHD_YES;
    }
    if (*upload_size > 0) {
        if (!r->too_big && r->body_len + *upload_size > s->o.max_body) r->too_big = true;
        if (!r->too_big) {
            char *b = realloc(r->body, r->body_len + *upload_size + 1);
            if (!b) return MHD_NO;
            memcpy(b + r->body_len, upload, *upload_size);
            r->body = b;
            r->body_len += *upload_size;
        }
        *upload_size = 0;
        return MHD_YES;
    }
    /* the whole body is in */
    pthread_mutex_lock(&s->mu);
    bool ready = r->queued_response, hup = r->client_hup && !r->status;
    pthread_mutex_unlock(&s->mu);
    if (hup) return MHD_NO; /* the client is gone: close */
    if (ready) { /* resumed by the engine thread: the answer is in r->out */
        char *o = r->out;
        size_t n = r->out_len;
        r->out = NULL;
        r->out_len = r->out_cap = 0;
        if (!o) return answer_error(r, 500, NULL, "out of memory");
        return answer(r, r->answer_status, o, n, "application/json", 0);
    }
    if (r->status || r->handled) return MHD_YES; /* answered, or waiting for the engine */
    r->handled = true;
    return handle_final(r);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **ctx, enum MHD_RequestTerminationCode toe) {
    (void)c;
    srv *s = cls;
    srv_req *r = *ctx;
    if (!r) return;
    *ctx = NULL;
    double ms = (srv_now() - r->t0) * 1e3;
    pthread_mutex_lock(&s->mu);
    r->conn_gone = true;
    unsigned st = r->status ? r->status : 499;
    s->m.requests[st / 100 < 6 ? st / 100 : 5]++;
    bool cancel = toe != MHD_REQUEST_TERMINATED_COMPLETED_OK && r->n_done < r->n_choices;
    if (cancel && !r->client_hup) s->m.cancelled++; /* a hang-up seen by poll_clients counted already */
    for (size_t i = 0; i < r->n_choices; i++)
        if (r->choices[i].live) cmf_engine_cancel(s->eng, r->choices[i].seq_id);
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    char ts[32];
    strftime(ts, sizeof ts, "%Y-%m-%dT%H:%M:%SZ", &tm);
    FILE *log = s->o.log ? s->o.log : stderr;
    char key[24] = "";
    if (r->key >= 0) snprintf(key, sizeof key, " key#%d", r->key);
    fprintf(log, "%s %s %s %u %zuB %.1fms%s%s\n", ts, r->method, r->path, st, r->bytes_out, ms, key,
            cancel ? " client-gone" : "");
    fflush(log);
    srv_req_unref(r);
    pthread_mutex_unlock(&s->mu);
}

/* ---- the server ----------------------------------------------------------- */

void cmf_server_default_opts(cmf_server_opts *o) {
    memset(o, 0, sizeof *o);
    o->port = 8080;
    o->parallel = 16;
    o->prefix_cache = true;
    o->batch_invariant = true;
    o->max_body = 4u << 20;
    o->max_n = 16;
    o->queue = 64;
    o->ping_s = 5.0;
    o->draft_max = o->draft_min = -1;
    o->draft_p_min = -1.0f;
}

static bool is_loopback(const struct sockaddr *sa) {
    if (sa->sa_family == AF_INET)
        return (ntohl(((const struct sockaddr_in *)sa)->sin_addr.s_addr) >> 24) == 127;
    if (sa->sa_family == AF_INET6) {
        const struct in6_addr *a = &((const struct sockaddr_in6 *)sa)->sin6_addr;
        if (IN6_IS_ADDR_LOOPBACK(a)) return true;
        if (IN6_IS_ADDR_V4MAPPED(a)) return a->s6_addr[12] == 127;
    }
    return false;
}


cmf_status cmf_server_run(const cmf_server_opts *o, cmf_error *err) {
    srv *s = calloc(1, sizeof *s);
    if (!s) return cmf_error_set(err, CMF_ERR_NOMEM, "serve: out of memory");
    s->o = *o;
    s->loading = true;
    if (pthread_mutex_init(&s->mu, NULL) != 0) {
        free(s);
        return cmf_error_set(err, CMF_ERR_NOMEM, "serve: mutex");
    }
    if (pthread_cond_init(&s->ws_cv, NULL) != 0) {
        pthread_mutex_destroy(&s->mu);
        free(s);
        return cmf_error_set(err, CMF_ERR_NOMEM, "serve: condition variable");
    }
    cmf_status st = CMF_OK;
    const char *host = o->host ? o->host : "127.0.0.1";
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE}, *ai = NULL;
    char port[8];
    snprintf(port, sizeof port, "%u", (unsigned)o->port);
    int gai = getaddrinfo(host, port, &hints, &ai);
    if (gai != 0 || !ai) {
        st = cmf_error_set(err, CMF_ERR_ARG, "--host %s: %s", host, gai ? gai_strerror(gai) : "no address");
        goto out;
    }
    s->loopback = is_loopback(ai->ai_addr);
    if (!s->loopback && o->n_api_keys == 0 && !o->insecure) {
        st = cmf_error_set(err, CMF_ERR_ARG,
                           "--host %s is not a loopback address: give --api-key KEY or --api-key-file F "
                           "(or --insecure to serve without a key)", host);
        goto out;
    }
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_AUTO | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG;
    if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    /* 2,048 connections, 600 s idle (llama-server's timeout); off loopback one client address may hold at most
     * SRV_CONN_PER_IP of them, so one host's idle sockets cannot lock the others out (on loopback every
     * client is 127.0.0.1: local proxies and tools share it) */
    s->mhd = MHD_start_daemon(flags, o->port, NULL, NULL, on_request, s, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, s,
                              MHD_OPTION_SOCK_ADDR, ai->ai_addr,
                              MHD_OPTION_NOTIFY_COMPLETED, on_completed, s, MHD_OPTION_CONNECTION_LIMIT,
                              (unsigned)2048, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)600,
                              MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)(s->loopback ? 0 : SRV_CONN_PER_IP),
                              MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)(64 * 1024), MHD_OPTION_END);
    if (!s->mhd) {
        st = cmf_error_set(err, CMF_ERR_IO, "cannot listen on %s port %u (in use, or not an address of this machine)",
                           host, (unsigned)o->port);
        goto out;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->mhd, MHD_DAEMON_INFO_LISTEN_FD);
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    if (di && getsockname(di->listen_fd, (struct sockaddr *)&ss, &sl) == 0)
        s->port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                                 : ((struct sockaddr_in *)&ss)->sin_port);
    FILE *log = o->log ? o->log : stderr;
    fprintf(log, "cmf serve: listening on http://%s%s%s:%u (loading %s)\n", strchr(host, ':') ? "[" : "", host,
            strchr(host, ':') ? "]" : "", (unsigned)s->port, o->model_path);
    fflush(log);
    st = srv_load(s, err);
    if (st != CMF_OK) goto out;
    pthread_mutex_lock(&s->mu);
    s->loading = false;
    pthread_mutex_unlock(&s->mu);
    fprintf(log, "cmf serve: ready: model \"%s\", %u sequences, context %u per sequence%s\n", s->model_id,
            o->parallel, s->n_seq_ctx, o->n_api_keys ? ", API key required" : "");
    fflush(log);
    srv_engine_loop(s);
    srv_shutdown_requests(s);
out:
    if (s->mhd) MHD_stop_daemon(s->mhd);
    if (ai) freeaddrinfo(ai);
    srv_unload(s);
    pthread_cond_destroy(&s->ws_cv);
    pthread_mutex_destroy(&s->mu);
    free(s);
    return st;
}
