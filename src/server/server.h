/*
 * server.h — `cmf serve`: an OpenAI-compatible HTTP server over one
 * cmf_engine (include/cmf/engine.h). This header is the module's inside:
 * the server state shared by its files and the one entry point the CLI
 * (tools/cmd_serve.c) calls.
 *
 * Threads: libmicrohttpd runs one internal polling thread (http.c) that
 * reads requests, checks auth/limits, parses and validates them
 * (request.c), tokenizes the prompt and queues engine sequences
 * (cmf_engine_add is thread-safe); connections waiting for tokens are
 * suspended (MHD_suspend_connection), never given a thread. The thread
 * that calls cmf_server_run steps the engine (gen.c): its callbacks format
 * the tokens (SSE chunks or the final JSON) into the request's buffer and
 * resume the connection (MHD_resume_connection). All request state is
 * guarded by srv.mu; MHD calls are made outside it except the suspend,
 * which runs on MHD's own thread.
 *
 * Files: http.c (the HTTP layer, auth, CORS, Host check, limits, logging),
 * json_strict.c (strict JSON, OpenAI error bodies), request.c (request
 * fields -> sequence parameters), gen.c (the engine thread, streaming,
 * responses, logprobs, disconnects), routes.c (models, tokenize,
 * detokenize, embeddings, status, health), metrics.c (Prometheus text),
 * chat.html (the page at /, embedded at build time as chat_page.c).
 */
#ifndef CMF_SERVER_H
#define CMF_SERVER_H

#include "cmf/engine.h"
#include "cmf/grammar.h"
#include "cmf/policy.h"
#include "cmf/tools.h"

#include <cjson/cJSON.h>
#include <pthread.h>
#include <stdio.h>

/* ---- options (cmd_serve.c fills them) ------------------------------------ */

typedef struct cmf_server_opts {
    const char *model_path;
    const char *alias;          /* model id in the API (NULL: the file's base name) */
    const char *host;           /* NULL = 127.0.0.1 */
    uint16_t port;              /* 0 = any free port (printed) */
    const char *const *api_keys;/* keys accepted (Bearer, or a Basic password) */
    size_t n_api_keys;
    bool insecure;              /* allow a non-loopback bind without a key */
    const char *cors_origin;    /* NULL = no CORS headers */
    int n_threads;              /* 0 = physical cores */
    const char *device;         /* cmf_device_open spec (NULL = a CPU device of n_threads) */
    uint32_t gpu_layers;        /* cmf_model_params.gpu_layers (-ngl; 0 = all on the device) */
    uint32_t parallel;          /* sequences decoding at once (engine n_seq_max) */
    uint32_t n_ctx;             /* KV tokens of all sequences (0 = engine default) */
    uint32_t n_batch;           /* engine token budget per step (0 = default) */
    bool batch_invariant;       /* engine exact mode */
    bool prefix_cache;
    const char *draft_path;     /* --draft: a draft model of the same tokenizer (NULL: none) */
    const char *drafter_path;   /* --drafter: a block drafter of the target (NULL: none) */
    uint32_t lookup;            /* --lookup N: n-gram prompt lookup drafter of N tokens (0: off) */
    int32_t draft_max, draft_min; /* --draft-max / --draft-min (-1: the drafter's defaults) */
    float draft_p_min;          /* --draft-p-min (< 0: the default) */
    bool draft_fixed;           /* --draft-fixed: always draft_max (no adaptive length) */
    size_t max_body;            /* request body bytes */
    uint32_t max_prompt;        /* prompt tokens (0 = the sequence context) */
    uint32_t max_tokens;        /* ceiling of max_tokens and its defaults (0 = the sequence context) */
    uint32_t max_n;             /* n ceiling */
    uint32_t queue;             /* sequences allowed to wait beyond `parallel` */
    uint32_t per_key;           /* concurrent requests per key (0 = no limit) */
    double ping_s;              /* SSE comment ping period before the first token */
    /* LoRA adapters a request may name (model "base+NAME@SCALE"): loaded at start */
    const char *const *lora_names; /* [n_lora] API names (no '+', '@', ':') */
    const char *const *lora_paths; /* [n_lora] adapter files (cmf lora import) */
    const float *lora_scales;      /* [n_lora] scale of "+NAME" without "@SCALE" */
    size_t n_lora;
    FILE *log;                  /* one line per request (NULL = stderr) */
    bool (*should_stop)(void *); /* polled between steps (Ctrl-C) */
    void *stop_user;
} cmf_server_opts;

void cmf_server_default_opts(cmf_server_opts *o);
/* Bind, load the model (/health answers 503 meanwhile), serve until
 * should_stop. Errors: CMF_ERR_ARG (bad options: a non-loopback host
 * without a key, ...), CMF_ERR_IO (bind failed), the model's load errors. */
cmf_status cmf_server_run(const cmf_server_opts *o, cmf_error *err);

/* ---- shared state --------------------------------------------------------- */

#define SRV_MAX_STOP 16
#define SRV_MAX_CHOICES 128
#define SRV_MAX_TOP_LOGPROBS 20
#define SRV_MAX_LORA_SCALE 100.0
#define SRV_MAX_OVERLAYS 256   /* distinct adapter combinations resolved at most */

struct MHD_Daemon;
struct MHD_Connection;
typedef struct srv srv;
typedef struct srv_req srv_req;

/* Histogram of seconds (Prometheus cumulative buckets). */
#define SRV_HIST_N 14
typedef struct srv_hist {
    uint64_t count[SRV_HIST_N + 1]; /* last: +Inf */
    double sum;
    uint64_t n;
} srv_hist;

typedef struct srv_metrics {
    uint64_t requests[6];   /* by status class: [1]=1xx ... [5]=5xx */
    uint64_t prompt_tokens, gen_tokens;
    uint64_t device_sampled; /* tokens whose event came without logits: sampled on the model's device */
    uint64_t cancelled, rejected_429;
    srv_hist ttft, itl, e2e;
    uint32_t running, waiting;
    uint64_t steps;
    cmf_kv_stats kv;        /* after the last step */
    cmf_spec_stats spec; /* speculation totals after the last step */
} srv_metrics;

/* One choice of a generation request: one engine sequence. */
typedef struct srv_choice {
    srv_req *req;
    uint32_t index;
    uint64_t seq_id;
    bool live;              /* queued in the engine, end event not yet seen */
    bool done;
    bool started;           /* first token seen */
    cmf_stop_reason stop;
    cmf_status status;
    char *errmsg;
    char *text;             /* all text so far (non-stream answer, tool parsing) */
    size_t len, cap;
    size_t n_gen;
    cJSON *logprobs;        /* chat: content[]; completions: the 4 arrays object */
    cJSON *lp_chunk;        /* stream: entries since the last chunk */
    size_t text_offset;     /* completions logprobs */
    size_t emitted;         /* stream with tools: bytes of text sent as content */
    double t_last;          /* time of the last token (ITL) */
} srv_choice;

typedef enum srv_route {
    R_NONE = 0, R_CHAT, R_COMPLETIONS, R_EMBEDDINGS, R_MODELS, R_MODEL, R_HEALTH, R_METRICS,
    R_TOKENIZE, R_DETOKENIZE, R_STATUS, R_PAGE, R_OPTIONS
} srv_route;

/* A generation request as parsed (request.c). */
typedef struct srv_gen {
    bool chat, stream, include_usage;
    uint32_t n;             /* choices per prompt */
    int32_t **prompts;      /* [n_prompts] token ids */
    size_t *n_prompt;
    size_t n_prompts;
    cmf_sampler_params sampler;
    cmf_logit_bias *bias;
    int32_t max_tokens;
    char *stops[SRV_MAX_STOP + 8];
    size_t n_stop;
    int32_t eos[CMF_MODEL_EOS_MAX];
    size_t n_eos;
    uint64_t weight_set;
    bool logprobs;          /* chat: logprobs; completions: logprobs >= 0 given */
    uint32_t top_logprobs;
    char *model;            /* as the request named it */
    cmf_grammar *grammar;   /* response_format or a forced tool call (NULL: none) */
    bool tools;             /* parse tool calls from the output (tool_choice not "none") */
    bool no_draft;          /* "speculative": false (the server's drafter is not used) */
} srv_gen;

struct srv_req {
    srv *s;
    struct MHD_Connection *conn;
    srv_route route;
    char method[8];
    char path[128];
    char *body;
    size_t body_len;
    bool too_big;
    bool handled;           /* the body was dispatched */
    int key;                /* index of the key used, -1 none */
    double t0;
    unsigned status;        /* HTTP status sent (for the log) */
    size_t bytes_out;
    /* generation */
    srv_gen *gen;
    srv_choice *choices;
    size_t n_choices, n_done;
    int refs;               /* MHD's (until completed) + live sequences */
    bool conn_gone;         /* MHD finished the connection */
    bool client_hup;        /* the client closed its socket (or the answer is an error already) */
    bool suspended;
    bool queued_response;   /* the non-stream answer is ready (resume -> respond) */
    bool counted;           /* holds in-flight slots */
    bool finished;          /* the last byte is in out */
    char id[40];
    long created;
    /* the answer: a full body (non-stream) or SSE bytes not yet sent */
    char *out;
    size_t out_len, out_cap, out_sent;
    unsigned answer_status; /* non-stream */
    double t_first, t_last_ping;
    bool any_token;
    int fd;                 /* the client socket, for hang-up polling */
    bool http11;            /* HTTP/1.1 (a 1xx interim answer may be sent) */
    bool probed;            /* the peer shut its sending side: probed once (poll_clients) */
    srv_req *next_live, *prev_live;
};

/* Embedding job (run on the engine thread between steps). */
typedef struct srv_embed {
    srv_req *req;
    int32_t **inputs;
    size_t *n_input;
    size_t n_inputs;
    bool base64;
    struct srv_embed *next;
} srv_embed;

struct srv {
    cmf_server_opts o;
    struct MHD_Daemon *mhd;
    pthread_mutex_t mu;
    bool loading;           /* under mu */
    bool stopping;
    char *model_id;
    cmf_file *file;
    cmf_device *dev;
    cmf_model *model;
    cmf_tokenizer *tok;
    cmf_engine *eng;
    cmf_file *draft_file;   /* --draft (NULL: none) */
    cmf_model *draft_model;
    cmf_drafter *drafter;   /* --draft or --lookup (NULL: no speculation) */
    cmf_model_info info;
    uint32_t n_seq_ctx;
    bool loopback;
    uint16_t port;
    char **skills;          /* skill ids of header.skills */
    uint64_t *skill_ws;     /* their weight sets (resolved at load) */
    cmf_grammar_vocab *gvocab; /* the tokens' bytes for grammars (built at load) */
    cmf_tool_family fam;    /* the chat template's tool-call shape */
    bool tmpl_tool_calls;   /* the template renders an assistant turn's tool_calls */
    size_t n_skills;
    cmf_lora **loras;         /* [o.n_lora] the adapters (opened at load) */
    /* under mu */
    srv_req *live;          /* requests with live sequences */
    uint32_t in_flight;     /* sequences queued or running */
    uint32_t *per_key;      /* active requests by key */
    srv_embed *embed_head, *embed_tail;
    srv_metrics m;
    /* connections whose request ended during the engine step: resumed once
     * the step's statistics are in m, so that a client reading /metrics
     * right after its answer sees the answer's tokens counted */
    struct MHD_Connection *wake_after_step[64];
    size_t n_wake_after_step;
    bool in_step;           /* the engine thread is inside cmf_engine_step */
    uint64_t next_req;
    cmf_kv_cache *embed_kv; /* engine thread only */
    /* weight sets of adapter overlays: made on the engine thread only (the
     * model's weight-set calls may not run beside a step); under mu */
    pthread_cond_t ws_cv;   /* a resolve job finished, or stopping */
    struct srv_wsjob *ws_head;
    struct srv_wscache *ws_cache;
    size_t n_ws_cache, cap_ws_cache;
};

/* An overlay a request names: a base weight set plus adapters with scales. */
typedef struct srv_overlay {
    uint32_t base;                       /* the backbone 0 or a skill's weight set */
    uint32_t n;
    uint32_t lora[CMF_MODEL_MAX_LORA];   /* indices into s->loras */
    float scale[CMF_MODEL_MAX_LORA];
} srv_overlay;

typedef struct srv_wscache {
    srv_overlay ov;
    uint32_t ws;
} srv_wscache;

typedef struct srv_wsjob {
    srv_overlay ov;
    bool taken;             /* the engine thread works on it: the waiter stays */
    bool done;
    cmf_status st;
    uint32_t ws;
    char msg[256];
    struct srv_wsjob *next;
} srv_wsjob;

/* ---- json_strict.c ---- */
/* Strict parse of a request body: valid UTF-8, no NUL, one JSON value with
 * nothing after it, no duplicate keys in any object. NULL with msg set. */
cJSON *srv_json_parse(const char *body, size_t len, char *msg, size_t msg_cap);
/* {"error": {"message", "type", "param", "code"}} as text (malloc'd). */
char *srv_error_json(unsigned status, const char *param, const char *msg);
const char *srv_error_type(unsigned status);

/* ---- http.c ---- */
double srv_now(void);
/* Append to the request's output (under s->mu). false: out of memory. */
bool srv_out_append(srv_req *r, const char *data, size_t len);
bool srv_out_printf(srv_req *r, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
/* Wake a suspended connection: call without s->mu after srv_wake_take
 * returned true under it. */
bool srv_wake_take(srv_req *r);
void srv_resume_conn(struct MHD_Connection *c);
/* Drop one reference (under s->mu); frees the request at 0. */
void srv_req_unref(srv_req *r);

/* ---- request.c ---- */
/* Parse a chat (chat = true) or completions body into *g; on a client
 * error returns the HTTP status (400/404) with msg and *param set. */
unsigned srv_gen_parse(srv *s, const cJSON *body, bool chat, srv_gen *g, char *msg, size_t cap,
                       const char **param);
void srv_gen_free(srv_gen *g);
/* "base", "base:SKILL", then any number of "+ADAPTER" or "+ADAPTER@SCALE"
 * terms -> weight set; 0 ok, else HTTP status with msg (400 malformed,
 * 404 an unknown model, skill or adapter). An overlay not seen before is
 * resolved by the engine thread: the calling (HTTP) thread waits for it
 * (at most one engine step). Not under s->mu. */
unsigned srv_resolve_model(srv *s, const char *name, uint64_t *ws, char *msg, size_t cap);
/* Token ids of a "prompt"/"input" item: a string (encoded by the BOS rule)
 * or an array of ids. */
unsigned srv_prompt_ids(srv *s, const cJSON *item, const char *field, int32_t **ids, size_t *n, char *msg,
                        size_t cap);

/* ---- gen.c ---- */
/* Queue the request's sequences; 0 ok (the caller suspends), or an HTTP
 * status with msg (429 sets *retry). */
unsigned srv_gen_submit(srv_req *r, char *msg, size_t cap);
/* The engine thread: steps until should_stop. */
void srv_engine_loop(srv *s);
/* The engine thread: resolve the queued overlays (between steps). */
void srv_ws_jobs_run(srv *s);

/* ---- routes.c ---- */
cmf_status srv_load(srv *s, cmf_error *err);
void srv_unload(srv *s);
void srv_shutdown_requests(srv *s); /* gen.c */
/* Answer a non-generation route; returns status and a malloc'd body and
 * content type (static). Embeddings queue a job instead (returns 0). */
unsigned srv_route_simple(srv_req *r, const cJSON *body, char **out, const char **ctype);
void srv_embed_run(srv *s, srv_embed *job);
void srv_embed_free(srv_embed *job);

/* ---- metrics.c ---- */
void srv_hist_add(srv_hist *h, double v);
char *srv_metrics_text(srv *s); /* under s->mu */

/* chat_page.c (generated) */
extern const unsigned char cmf_server_chat_page[];
extern const size_t cmf_server_chat_page_len;

#endif /* CMF_SERVER_H */
