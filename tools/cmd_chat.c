/*
 * cmd_chat.c — `cmf chat MODEL.cmf`: an interactive multi-turn chat.
 *
 * Each turn renders the whole conversation with the file's chat template
 * (ChatML when it has none; cmf_chat_prompt_render through chat_prompt.c),
 * tokenizes it (cmf_model_encode_prompt), and prefills the session, which
 * keeps the longest common prefix already in the KV cache and runs only
 * the new suffix (cmf_session_prefill_tokens). When the conversation no
 * longer fits the context with room for an answer, the oldest whole turns
 * are dropped (the system prompt stays) and a line on stderr says so; a
 * turn that does not fit even alone is refused and the chat goes on. The
 * answer streams until a stop id of the model (cmf_model_eos_ids: its EOS
 * ids and the template's end-of-turn marker, <|im_end|>, <|eot_id|>,
 * <end_of_turn>, ...) or the marker's text when it is not a single token.
 * Text between <think> and </think> is shown dimmed on a terminal.
 *
 * Commands: /system TEXT, /reset, /save FILE, /load FILE (conversation
 * JSON: {"messages": [...]}), /help, /quit. Ctrl-C stops the current
 * answer (a SIGINT handler sets a flag the text callback checks); at the
 * prompt, Ctrl-D ends the chat. Line editing and history: libedit.
 */
#include "chat_prompt.h"
#include "chat_think.h"
#include "cli.h"
#include "cli_gpu.h"
#include "skill_flags.h"
#include "cli_lora.h"
#include "cli_grammar.h"

#include <cjson/cJSON.h>
#include <editline/readline.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static volatile sig_atomic_t g_interrupted; /* set by SIGINT during an answer */

static void on_sigint(int sig) {
    (void)sig;
    g_interrupted = 1;
}

static void usage(FILE *o) {
    fprintf(o,
            "usage: cmf chat MODEL.cmf [options]\n"
            "\n"
            "Interactive chat with the model's chat template (ChatML when the file has none).\n"
            "  -sys, --system TEXT   system prompt\n"
            "  -sysf, --system-prompt-file FILE   system prompt from a file\n"
            "  -p, --prompt TEXT     first user message, answered before the chat goes on\n"
            "                        (-p - reads it from stdin)\n"
            "  -f, --file FILE       first user message from a file (a trailing newline of\n"
            "                        a file or stdin is dropped, as llama.cpp's -f)\n"
            "  -e, --escape          process \\n \\r \\t \\' \\\" \\\\ \\xHH in -p/-f and typed lines\n"
            "  --no-think            render with enable_thinking=false\n"
            "  -n, --n-predict N     max tokens per answer (default -1: until end of turn)\n"
            "  -c, --ctx-size N      context size in tokens (default: min(4096, trained)); when the\n"
            "                        chat outgrows it, the oldest turns are dropped (the system prompt stays)\n"
            "  -t, --threads N       CPU threads (default: physical cores)\n"
            "  --device D            cpu (default), vulkan or vulkan:N (`cmf devices` lists them)\n"
            CLI_GPU_LAYERS_HELP
            "  --temp T, --top-k K, --top-p P, --min-p P, --repeat-penalty R, -s, --seed S\n"
            "  --greedy              argmax sampling (as --temp 0)\n"
            "  --load FILE           start from a saved conversation\n"
            "  --stats               after each answer, print prompt/KV-reuse and speed figures\n"
            "%s"
            "%s"
            "                        (chat: every answer is constrained by the grammar)\n"
            "Commands: /system TEXT, /reset, /save FILE, /load FILE, /help, /quit.\n"
            "Ctrl-C stops the current answer; Ctrl-D quits.\n",
            cli_lora_help, cli_grammar_help);
}

/* ---- conversation ----------------------------------------------------- */

typedef struct conv {
    cJSON *messages; /* array of {"role", "content"}; the system message, if any, first */
} conv;

static bool conv_add(conv *c, const char *role, const char *content) {
    cJSON *m = cJSON_CreateObject();
    if (!m || !cJSON_AddStringToObject(m, "role", role) || !cJSON_AddStringToObject(m, "content", content)) {
        cJSON_Delete(m);
        return false;
    }
    return cJSON_AddItemToArray(c->messages, m);
}

/* Set or replace the leading system message (empty text removes it). */
static bool conv_set_system(conv *c, const char *text) {
    cJSON *first = cJSON_GetArrayItem(c->messages, 0);
    const char *role = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(first, "role"));
    if (role && strcmp(role, "system") == 0) cJSON_DeleteItemFromArray(c->messages, 0);
    if (!text || !*text) return true;
    cJSON *m = cJSON_CreateObject();
    if (!m || !cJSON_AddStringToObject(m, "role", "system") || !cJSON_AddStringToObject(m, "content", text)) {
        cJSON_Delete(m);
        return false;
    }
    return cJSON_InsertItemInArray(c->messages, 0, m);
}

/* Write {"messages": [...]} to path via a temp file + rename. */
static bool conv_save(const conv *c, const char *path) {
    cJSON *root = cJSON_CreateObject();
    cJSON *dup = cJSON_Duplicate(c->messages, 1);
    if (!root || !dup || !cJSON_AddItemToObject(root, "messages", dup)) {
        cJSON_Delete(root);
        cJSON_Delete(dup);
        fprintf(stderr, "cmf chat: /save: out of memory\n");
        return false;
    }
    char *text = cJSON_Print(root);
    cJSON_Delete(root);
    size_t n = strlen(path) + 16;
    char *tmp = malloc(n);
    bool ok = text && tmp;
    if (ok) {
        snprintf(tmp, n, "%s.tmp", path);
        FILE *fp = fopen(tmp, "wb");
        ok = fp && fputs(text, fp) >= 0 && fputc('\n', fp) != EOF;
        if (fp && fclose(fp) != 0) ok = false;
        if (ok && rename(tmp, path) != 0) ok = false;
        if (!ok) {
            fprintf(stderr, "cmf chat: /save %s: %s\n", path, strerror(errno));
            remove(tmp);
        }
    }
    free(tmp);
    cJSON_free(text);
    return ok;
}

/* Read {"messages": [...]} (or a bare array); every message needs string
 * role and content. On error the conversation is unchanged. */
static bool conv_load(conv *c, const char *path) {
    char *buf = NULL;
    size_t len = 0;
    cmf_error err = {0};
    if (cmf_read_file_max(path, 64u << 20, &buf, &len, &err) != CMF_OK) { /* a saved chat: text */
        fprintf(stderr, "cmf chat: /load: %s\n", err.msg);
        return false;
    }
    cJSON *root = cJSON_ParseWithLength(buf, len);
    free(buf);
    cJSON *msgs = cJSON_IsArray(root) ? root : cJSON_GetObjectItemCaseSensitive(root, "messages");
    if (!cJSON_IsArray(msgs)) {
        fprintf(stderr, "cmf chat: /load %s: expected {\"messages\": [...]}\n", path);
        cJSON_Delete(root);
        return false;
    }
    int i = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, msgs) {
        if (!cJSON_IsString(cJSON_GetObjectItemCaseSensitive(m, "role")) ||
            !cJSON_IsString(cJSON_GetObjectItemCaseSensitive(m, "content"))) {
            fprintf(stderr, "cmf chat: /load %s: messages[%d]: needs string \"role\" and \"content\"\n", path, i);
            cJSON_Delete(root);
            return false;
        }
        i++;
    }
    cJSON *dup = cJSON_Duplicate(msgs, 1);
    cJSON_Delete(root);
    if (!dup) return false;
    cJSON_Delete(c->messages);
    c->messages = dup;
    return true;
}

/* ---- streaming ---------------------------------------------------------- */

typedef struct stream {
    chat_think think;  /* display, reasoning dimmed */
    char *answer;      /* everything generated, markers included */
    size_t alen, acap;
    bool oom;
} stream;

static void keep(stream *s, const char *t, size_t n) {
    if (s->alen + n + 1 > s->acap) {
        size_t nc = s->acap ? s->acap * 2 : 1024;
        while (nc < s->alen + n + 1) nc *= 2;
        char *p = realloc(s->answer, nc);
        if (!p) { s->oom = true; return; }
        s->answer = p;
        s->acap = nc;
    }
    memcpy(s->answer + s->alen, t, n);
    s->alen += n;
    s->answer[s->alen] = 0;
}

static bool on_text(const char *text, size_t len, void *user) {
    stream *s = user;
    keep(s, text, len);
    chat_think_feed(&s->think, text, len);
    return !g_interrupted;
}

/* ---- the chat loop ------------------------------------------------------ */

typedef struct chat_opts {
    const char *path, *system, *load;
    const char *prompt, *prompt_file, *system_file; /* -p, -f (or -p -), -sysf */
    int n_prompts;
    bool no_think, stats, escape;
    long n_predict, n_ctx, threads;
    const char *device;     /* --device, NULL = cpu */
    long ngl;               /* -ngl / --gpu-layers, -1 = not given */
    uint32_t gpu_layers;
    cmf_sampler_params sp;
    cli_skill skill; /* --skill, --route (on the first message), --blend */
    cli_lora lora;  /* --lora, --lora-scaled */
    cli_grammar_opts gopt; /* --grammar, --grammar-file, -j, -jf */
    cmf_grammar *grammar;  /* compiled once the tokenizer is loaded; every answer is constrained */
} chat_opts;

static int parse_args(int argc, char **argv, chat_opts *o) {
    const char *cmd = "chat";
    o->n_predict = -1;
    o->ngl = -1;
    o->sp = cmf_sampler_default_params();
    o->gopt.cmd = cmd;
    cli_skill_init(&o->skill);
    for (int i = 1; i < argc; i++) {
        const char *v;
        bool missing = false;
        double d = 0;
        long l = 0;
        unsigned long long u = 0;
        if (cli_is_help(argv[i])) { usage(stdout); fputs(cli_skill_help, stdout); return -1; }
        int wf = cli_weights_flag(cmd, argc, argv, &i, &o->skill, &o->lora);
        if (wf < 0) return CLI_EXIT_USAGE;
        if (wf > 0) continue;
        int grc = CLI_EXIT_OK;
        if (cli_grammar_flag(argc, argv, &i, &o->gopt, &missing, &grc)) {
            if (grc != CLI_EXIT_OK) return grc;
            if (missing) return cli_usage_error(cmd, "%s needs a value", argv[i]);
            continue;
        }
        bool gl_ok;
        if (cli_gpu_layers_flag(cmd, argc, argv, &i, &o->ngl, &gl_ok)) {
            if (!gl_ok) return CLI_EXIT_USAGE;
            continue;
        }
        if (cli_flag_value(argc, argv, &i, "--system", &v, &missing) || cli_flag_value(argc, argv, &i, "-sys", &v, &missing)) o->system = v;
        else if (cli_flag_value(argc, argv, &i, "-sysf", &v, &missing) || cli_flag_value(argc, argv, &i, "--system-prompt-file", &v, &missing)) o->system_file = v;
        else if (cli_flag_value(argc, argv, &i, "-p", &v, &missing) || cli_flag_value(argc, argv, &i, "--prompt", &v, &missing)) {
            if (v && strcmp(v, "-") == 0) o->prompt_file = v; /* stdin */
            else o->prompt = v;
            o->n_prompts++;
        } else if (cli_flag_value(argc, argv, &i, "-f", &v, &missing) || cli_flag_value(argc, argv, &i, "--file", &v, &missing)) {
            o->prompt_file = v;
            o->n_prompts++;
        } else if (strcmp(argv[i], "-e") == 0 || strcmp(argv[i], "--escape") == 0) o->escape = true;
        else if (strcmp(argv[i], "--no-think") == 0) o->no_think = true;
        else if (strcmp(argv[i], "--stats") == 0) o->stats = true;
        else if (strcmp(argv[i], "--greedy") == 0) o->sp.greedy = true;
        else if (cli_flag_value(argc, argv, &i, "--load", &v, &missing)) o->load = v;
        else if (cli_flag_value(argc, argv, &i, "-n", &v, &missing) || cli_flag_value(argc, argv, &i, "--n-predict", &v, &missing)) {
            if (!missing && !cli_parse_long(cmd, "-n", v, -1, 1 << 30, &o->n_predict)) return CLI_EXIT_USAGE;
        } else if (cli_flag_value(argc, argv, &i, "-c", &v, &missing) || cli_flag_value(argc, argv, &i, "--ctx-size", &v, &missing)) {
            if (!missing && !cli_parse_long(cmd, "-c", v, 0, 1 << 24, &o->n_ctx)) return CLI_EXIT_USAGE;
        } else if (cli_flag_value(argc, argv, &i, "--device", &v, &missing)) {
            if (!missing && !cli_device_spec(cmd, v)) return CLI_EXIT_USAGE;
            if (!missing) o->device = v;
        } else if (cli_flag_value(argc, argv, &i, "-t", &v, &missing) || cli_flag_value(argc, argv, &i, "--threads", &v, &missing)) {
            if (!missing && !cli_parse_long(cmd, "-t", v, 0, 1024, &o->threads)) return CLI_EXIT_USAGE;
        } else if (cli_flag_value(argc, argv, &i, "--temp", &v, &missing)) {
            if (!missing && !cli_parse_double(cmd, "--temp", v, 0, 100, &d)) return CLI_EXIT_USAGE;
            o->sp.temp = (float)d;
        } else if (cli_flag_value(argc, argv, &i, "--top-k", &v, &missing)) {
            if (!missing && !cli_parse_long(cmd, "--top-k", v, 0, 1 << 30, &l)) return CLI_EXIT_USAGE;
            o->sp.top_k = (int32_t)l;
        } else if (cli_flag_value(argc, argv, &i, "--top-p", &v, &missing)) {
            if (!missing && !cli_parse_double(cmd, "--top-p", v, 0, 1, &d)) return CLI_EXIT_USAGE;
            o->sp.top_p = (float)d;
        } else if (cli_flag_value(argc, argv, &i, "--min-p", &v, &missing)) {
            if (!missing && !cli_parse_double(cmd, "--min-p", v, 0, 1, &d)) return CLI_EXIT_USAGE;
            o->sp.min_p = (float)d;
        } else if (cli_flag_value(argc, argv, &i, "--repeat-penalty", &v, &missing)) {
            if (!missing && !cli_parse_double(cmd, "--repeat-penalty", v, 0, 100, &d)) return CLI_EXIT_USAGE;
            o->sp.repeat_penalty = (float)d;
        } else if (cli_flag_value(argc, argv, &i, "-s", &v, &missing) || cli_flag_value(argc, argv, &i, "--seed", &v, &missing)) {
            if (!missing && !cli_parse_u64(cmd, "--seed", v, &u)) return CLI_EXIT_USAGE;
            o->sp.seed = u;
            o->sp.has_seed = true;
        } else if (argv[i][0] == '-' && argv[i][1]) return cli_usage_error(cmd, "unknown option '%s'", argv[i]);
        else if (!o->path) o->path = argv[i];
        else return cli_usage_error(cmd, "unexpected argument '%s'", argv[i]);
        if (missing) return cli_usage_error(cmd, "%s needs a value", argv[i]);
    }
    if (!o->path) return cli_usage_error(cmd, "missing MODEL.cmf");
    if (o->n_prompts > 1) return cli_usage_error(cmd, "give the first message once: -p TEXT, -f FILE or -p -");
    if (o->system && o->system_file) return cli_usage_error(cmd, "give --system or -sysf, not both");
    if (cli_skill_check(cmd, &o->skill, o->lora.n) != CLI_EXIT_OK) return CLI_EXIT_USAGE;
    if (o->skill.route && !o->n_prompts) return cli_usage_error(cmd, "--route routes on the first message: give -p or -f");
    if (!cli_gpu_layers_apply(cmd, o->ngl, &o->device, &o->gpu_layers)) return CLI_EXIT_USAGE;
    return 0;
}

/* Read one line: libedit on a terminal, plain stdio otherwise. NULL at EOF. */
static char *read_line(bool tty) {
    if (tty) {
        char *l = readline("> ");
        if (l && *l) add_history(l);
        return l;
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t n = getline(&line, &cap, stdin);
    if (n < 0) {
        free(line);
        return NULL;
    }
    while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r')) line[--n] = 0;
    return line;
}

/* answer() result besides the CLI exit codes: the new turn does not fit
 * the context even alone (or the KV cache refused it); it is dropped and
 * the chat goes on. */
#define ANSWER_CONTEXT_FULL 3

/* Where a generation stops: the model's stop ids and, for end-of-turn
 * markers that are no single token, stop strings (cmf/policy.h). */
typedef struct turn_end {
    int32_t ids[CMF_MODEL_EOS_MAX];
    size_t n_ids;
    const char *stops[16];
    size_t n_stops;
} turn_end;

static void turn_end_init(turn_end *e, const cmf_file *f, const cmf_tokenizer *tok) {
    size_t cap = sizeof e->stops / sizeof e->stops[0];
    e->n_ids = cmf_model_eos_ids(f, tok, true, e->ids, CMF_MODEL_EOS_MAX);
    e->n_stops = cmf_model_chat_stop_strings(f, tok, e->stops, cap);
    if (e->n_stops > cap) e->n_stops = cap;
}

/* A conversation rendered with the chat template and tokenized. */
typedef struct prompt_ids {
    char *text;
    int32_t *ids;
    size_t n;
} prompt_ids;

static void prompt_free(prompt_ids *p) {
    free(p->text);
    free(p->ids);
    memset(p, 0, sizeof *p);
}

/* Render and tokenize `messages` without [from, from + drop). */
static cmf_status encode_conv(const chat_opts *o, const cmf_file *f, const cmf_tokenizer *tok, const cJSON *messages,
                              int from, int drop, prompt_ids *out, cmf_error *err) {
    memset(out, 0, sizeof *out);
    cJSON *view = drop > 0 ? cJSON_Duplicate(messages, 1) : NULL;
    if (drop > 0 && !view) return cmf_error_set(err, CMF_ERR_NOMEM, "out of memory");
    for (int k = 0; k < drop; k++) cJSON_DeleteItemFromArray(view, from);
    size_t len = 0;
    cmf_status st = cli_render_messages(f, tok, view ? view : messages, o->no_think, &out->text, &len, err);
    cJSON_Delete(view);
    if (st == CMF_OK) st = cmf_model_encode_prompt(f, tok, out->text, len, true, &out->ids, &out->n, err);
    if (st != CMF_OK) prompt_free(out);
    return st;
}

static bool is_role(const cJSON *m, const char *role) {
    const char *r = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(m, "role"));
    return r && strcmp(r, role) == 0;
}

/* The prompt of the next turn, fitted into n_ctx tokens with room for the
 * answer (-n tokens, or a quarter of the context when -n is -1; at most
 * half of it). When the conversation is longer, the fewest oldest whole
 * turns (a turn starts at a user message; the leading system message
 * stays) are dropped from it, and a line on stderr says so. When even the
 * newest turn alone does not fit, the conversation is left unchanged and
 * ANSWER_CONTEXT_FULL returned. */
static int fit_context(const chat_opts *o, const cmf_file *f, const cmf_tokenizer *tok, uint32_t n_ctx, conv *c,
                       prompt_ids *p) {
    cmf_error err = {0};
    size_t want = o->n_predict > 0 ? (size_t)o->n_predict : n_ctx / 4;
    size_t room = want < n_ctx / 2 ? want : n_ctx / 2;
    if (encode_conv(o, f, tok, c->messages, 0, 0, p, &err) != CMF_OK) return cli_fail("chat", &err);
    if (p->n + room <= n_ctx) return CLI_EXIT_OK;
    /* cut points: dropping [from, cut) leaves whole turns, the newest last */
    int n_msgs = cJSON_GetArraySize(c->messages), from = is_role(cJSON_GetArrayItem(c->messages, 0), "system");
    int *cuts = malloc((size_t)n_msgs * sizeof *cuts), m = 0;
    if (!cuts) {
        prompt_free(p);
        fprintf(stderr, "cmf chat: out of memory\n");
        return CLI_EXIT_FAIL;
    }
    for (int i = from + 1; i < n_msgs; i++)
        if (is_role(cJSON_GetArrayItem(c->messages, i), "user")) cuts[m++] = i;
    /* the fewest dropped turns that leave room (the prompt shrinks as
     * more go): binary search over the cut points */
    prompt_ids best = {0};
    int lo = 0, hi = m;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        prompt_ids q;
        if (encode_conv(o, f, tok, c->messages, from, cuts[mid] - from, &q, &err) != CMF_OK) {
            prompt_free(&best);
            prompt_free(p);
            free(cuts);
            return cli_fail("chat", &err);
        }
        if (q.n + room <= n_ctx) {
            prompt_free(&best);
            best = q;
            hi = mid;
        } else {
            prompt_free(&q);
            lo = mid + 1;
        }
    }
    int cut = best.ids ? cuts[hi] : m > 0 ? cuts[m - 1] : from;
    if (best.ids) {
        prompt_free(p);
        *p = best;
    } else if (m > 0) {
        /* none leaves the whole room: the newest turn alone, if it fits */
        prompt_free(p);
        if (encode_conv(o, f, tok, c->messages, from, cut - from, p, &err) != CMF_OK) {
            free(cuts);
            return cli_fail("chat", &err);
        }
    }
    if (p->n >= n_ctx) {
        fprintf(stderr,
                "cmf chat: this message does not fit the context: the prompt is %zu tokens%s, the context holds "
                "%u (-c); the message is dropped\n",
                p->n, from ? " with the system prompt" : "", n_ctx);
        prompt_free(p);
        free(cuts);
        return ANSWER_CONTEXT_FULL;
    }
    free(cuts);
    if (cut > from) {
        int turns = 0;
        for (int i = from; i < cut; i++) turns += is_role(cJSON_GetArrayItem(c->messages, i), "user");
        for (int i = from; i < cut; i++) cJSON_DeleteItemFromArray(c->messages, from);
        fprintf(stderr, "[context full: dropped the oldest %d turn%s (%d messages) to fit %u tokens%s]\n", turns,
                turns == 1 ? "" : "s", cut - from, n_ctx, from ? "; the system prompt stays" : "");
    }
    return CLI_EXIT_OK;
}

/* One assistant turn for the conversation as it stands. */
static int answer(const chat_opts *o, cmf_file *f, const cmf_tokenizer *tok, cmf_session *s, conv *c,
                  const turn_end *te, bool tty) {
    cmf_error err = {0};
    prompt_ids p;
    int rc = fit_context(o, f, tok, cmf_session_n_ctx(s), c, &p);
    if (rc != CLI_EXIT_OK) return rc;
    size_t n_ids = p.n;
    stream sm = {0};
    chat_think_init(&sm.think, stdout, tty, chat_prompt_opens_think(p.text));
    /* Ctrl-C from here on stops this answer (at its first piece when it
     * comes during the prefill), not the program */
    struct sigaction sa, old;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    g_interrupted = 0;
    sigaction(SIGINT, &sa, &old);
    cmf_status st = cmf_session_prefill_tokens(s, p.ids, p.n, &err);
    prompt_free(&p);
    if (st != CMF_OK) {
        sigaction(SIGINT, &old, NULL);
        if (st != CMF_ERR_CONTEXT_FULL) return cli_fail("chat", &err);
        fprintf(stderr, "[%s: /reset to start over]\n", err.msg); /* not fatal */
        return ANSWER_CONTEXT_FULL;
    }
    cmf_gen_params gp = {.n_predict = (int32_t)o->n_predict, .eos_ids = te->ids, .n_eos = te->n_ids,
                         .stop_strings = te->stops, .n_stop = te->n_stops, .grammar = o->grammar};
    cmf_gen_stats stats = {0};
    if (st == CMF_OK) st = cmf_session_generate(s, &gp, on_text, &sm, &stats, &err);
    sigaction(SIGINT, &old, NULL);
    chat_think_finish(&sm.think);
    fputc('\n', stdout);
    fflush(stdout);
    if (g_interrupted) fprintf(stderr, "[stopped]\n");
    if (o->stats)
        fprintf(stderr, "[prompt %zu tokens, %zu prefilled (%zu reused from the KV cache) in %.3f s; %zu generated in %.3f s]\n",
                n_ids, stats.n_prompt_tokens, n_ids - (stats.n_prompt_tokens < n_ids ? stats.n_prompt_tokens : n_ids),
                stats.prompt_seconds, stats.n_generated, stats.gen_seconds);
    if (stats.stop == CMF_STOP_CONTEXT_FULL)
        fprintf(stderr, "[context full: the answer is cut short; the next turn drops the oldest turns]\n");
    bool ok = st == CMF_OK && !sm.oom && conv_add(c, "assistant", sm.answer ? sm.answer : "");
    free(sm.answer);
    if (st != CMF_OK) return cli_fail("chat", &err);
    if (!ok) {
        fprintf(stderr, "cmf chat: out of memory\n");
        return CLI_EXIT_FAIL;
    }
    return CLI_EXIT_OK;
}

int cmd_chat(int argc, char **argv) {
    chat_opts o = {0};
    int rc = parse_args(argc, argv, &o);
    if (rc) return rc < 0 ? CLI_EXIT_OK : rc;
    char *first = NULL, *sysf = NULL; /* -p/-f message, -sysf text */
    size_t first_len = 0, sysf_len = 0;
    rc = cli_get_prompt("chat", o.prompt, o.prompt_file, true, o.escape, &first, &first_len);
    if (rc == CLI_EXIT_OK && o.system_file) rc = cli_get_prompt("chat", NULL, o.system_file, true, false, &sysf, &sysf_len);
    if (rc == CLI_EXIT_OK && ((first && memchr(first, 0, first_len)) || (sysf && memchr(sysf, 0, sysf_len)))) {
        fprintf(stderr, "cmf chat: a message cannot hold a NUL byte\n");
        rc = CLI_EXIT_FAIL;
    }
    if (rc != CLI_EXIT_OK) {
        free(first);
        free(sysf);
        return rc;
    }
    if (sysf) o.system = sysf;
    cmf_error err = {0};
    cmf_file *f = NULL;
    cmf_tokenizer *tok = NULL;
    cmf_model *model = NULL;
    cmf_session *s = NULL;
    turn_end *te = malloc(sizeof *te);
    conv c = {cJSON_CreateArray()};
    rc = CLI_EXIT_FAIL;
    if (!c.messages || !te) { fprintf(stderr, "cmf chat: out of memory\n"); goto done; }
    if (!cli_open_file("chat", o.path, &f)) goto done;
    size_t tl = 0;
    const char *tj = cmf_file_tokenizer_json(f, &tl);
    if (!tj || !tl) { fprintf(stderr, "cmf chat: %s: the file has no tokenizer\n", o.path); goto done; }
    if (cmf_tokenizer_load_json(tj, tl, &tok, &err) != CMF_OK) { cli_fail("chat", &err); goto done; }
    cmf_model_params mp = {.n_threads = (int)o.threads, .backend = o.device, .n_ctx = (uint32_t)o.n_ctx,
                           .gpu_layers = o.gpu_layers};
    if (cmf_model_load(f, &mp, &model, &err) != CMF_OK) { cli_fail("chat", &err); goto done; }
    cli_warn_ctx("chat", model, o.n_ctx);
    uint32_t ws = 0;
    {
        int32_t *rids = NULL; /* --route: the first message, tokenized as a raw prompt */
        size_t nr = 0;
        if (o.skill.route && cmf_model_encode_prompt(f, tok, first, first_len, false, &rids, &nr, &err) != CMF_OK) {
            cli_fail("chat", &err);
            goto done;
        }
        int src = cli_skill_resolve("chat", model, f, rids, nr, &o.skill, &ws);
        free(rids);
        if (src != CLI_EXIT_OK) { rc = src; goto done; }
    }
    if (!cli_lora_apply("chat", model, &o.lora, &ws)) goto done;
    cmf_session_params sp = {.n_ctx = (uint32_t)o.n_ctx, .kv_type = CMF_KV_F16, .sampler = o.sp, .weight_set = ws};
    if (cmf_session_new(model, tok, &sp, &s, &err) != CMF_OK) { cli_fail("chat", &err); goto done; }
    turn_end_init(te, f, tok);
    {
        cmf_model_info mi;
        cmf_model_get_info(model, &mi);
        int grc = cli_grammar_load("chat", &o.gopt, tok, mi.n_vocab, te->ids, te->n_ids, &o.grammar);
        if (grc != CLI_EXIT_OK) { rc = grc; goto done; }
    }
    if (o.load && !conv_load(&c, o.load)) goto done;
    if (o.system && !conv_set_system(&c, o.system)) goto done;

    bool tty = isatty(STDIN_FILENO) && isatty(STDOUT_FILENO);
    if (tty) fprintf(stderr, "cmf chat: %s — /help for commands, Ctrl-C stops an answer, Ctrl-D quits\n", o.path);
    rc = CLI_EXIT_OK;
    for (;;) {
        bool typed = !first; /* -p/-f: the first message, never a command */
        char *line = typed ? read_line(tty) : first;
        first = NULL;
        if (!line) break;
        if (typed && o.escape) cli_process_escapes(line, strlen(line));
        if (typed && line[0] == '/') {
            char *arg = strchr(line, ' ');
            if (arg) *arg++ = 0;
            if (strcmp(line, "/quit") == 0 || strcmp(line, "/exit") == 0) { free(line); break; }
            else if (strcmp(line, "/help") == 0) fprintf(stderr, "/system TEXT, /reset, /save FILE, /load FILE, /quit\n");
            else if (strcmp(line, "/system") == 0) {
                if (!conv_set_system(&c, arg ? arg : "")) fprintf(stderr, "cmf chat: out of memory\n");
                else fprintf(stderr, arg && *arg ? "[system prompt set]\n" : "[system prompt removed]\n");
            } else if (strcmp(line, "/reset") == 0) {
                cJSON *sys = NULL;
                cJSON *first = cJSON_GetArrayItem(c.messages, 0);
                const char *role = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(first, "role"));
                if (role && strcmp(role, "system") == 0) sys = cJSON_DetachItemFromArray(c.messages, 0);
                cJSON_Delete(c.messages);
                c.messages = cJSON_CreateArray();
                if (!c.messages) { cJSON_Delete(sys); free(line); rc = CLI_EXIT_FAIL; break; }
                if (sys) cJSON_AddItemToArray(c.messages, sys);
                cmf_session_reset(s);
                fprintf(stderr, "[conversation reset]\n");
            } else if (strcmp(line, "/save") == 0 || strcmp(line, "/load") == 0) {
                if (!arg || !*arg) fprintf(stderr, "usage: %s FILE\n", line);
                else if (line[1] == 's' ? conv_save(&c, arg) : conv_load(&c, arg))
                    fprintf(stderr, "[%s %s: %d messages]\n", line[1] == 's' ? "saved" : "loaded", arg,
                            cJSON_GetArraySize(c.messages));
            } else fprintf(stderr, "unknown command %s (/help)\n", line);
            free(line);
            continue;
        }
        if (!*line) { free(line); continue; }
        bool ok = conv_add(&c, "user", line);
        free(line);
        if (!ok) { fprintf(stderr, "cmf chat: out of memory\n"); rc = CLI_EXIT_FAIL; break; }
        int arc = answer(&o, f, tok, s, &c, te, tty);
        if (arc != CLI_EXIT_OK) {
            /* drop the failed user turn so the user can retry */
            cJSON_DeleteItemFromArray(c.messages, cJSON_GetArraySize(c.messages) - 1);
            if (!tty && arc != ANSWER_CONTEXT_FULL) { rc = CLI_EXIT_FAIL; break; }
        }
    }
done:
    free(first);
    free(sysf);
    free(te);
    cJSON_Delete(c.messages);
    cmf_session_free(s);
    cmf_model_free(model);
    cli_lora_free(&o.lora);
    cmf_grammar_free(o.grammar);
    cmf_tokenizer_free(tok);
    cmf_file_close(f);
    return rc;
}
