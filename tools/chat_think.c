/*
 * chat_think.c — the <think> splitter of `cmf chat` (see chat_think.h).
 * A small state machine: bytes that match a prefix of the marker expected
 * next ("<think>" outside, "</think>" inside) are held until the marker is
 * complete (switch style) or broken (print them).
 */
#include "chat_think.h"

#include <string.h>

#define DIM "\x1b[2m"
#define RESET "\x1b[0m"

void chat_think_init(chat_think *t, FILE *out, bool tty, bool start_thinking) {
    memset(t, 0, sizeof *t);
    t->out = out;
    t->tty = tty;
    t->thinking = start_thinking;
}

static void put(chat_think *t, const char *s, size_t n) {
    if (!n) return;
    if (t->tty && t->thinking) fputs(DIM, t->out);
    fwrite(s, 1, n, t->out);
    if (t->tty && t->thinking) fputs(RESET, t->out);
}

void chat_think_feed(chat_think *t, const char *text, size_t n) {
    char buf[4096];
    size_t bl = 0;
    for (size_t i = 0; i < n; i++) {
        const char *marker = t->thinking ? "</think>" : "<think>";
        size_t ml = strlen(marker);
        t->pending[t->npending++] = text[i];
        if (memcmp(t->pending, marker, t->npending) == 0) {
            if (t->npending == ml) {
                put(t, buf, bl);
                bl = 0;
                if (!t->tty) fwrite(marker, 1, ml, t->out);
                t->thinking = !t->thinking;
                t->npending = 0;
            }
            continue;
        }
        /* not the marker: print the held bytes except a last '<' that
         * may begin the next one */
        size_t keep = t->pending[t->npending - 1] == '<' ? 1 : 0;
        for (size_t k = 0; k + keep < t->npending; k++) {
            if (bl == sizeof buf) { put(t, buf, bl); bl = 0; }
            buf[bl++] = t->pending[k];
        }
        t->pending[0] = '<';
        t->npending = keep;
    }
    put(t, buf, bl);
    fflush(t->out);
}

void chat_think_finish(chat_think *t) {
    put(t, t->pending, t->npending);
    t->npending = 0;
    fflush(t->out);
}

bool chat_prompt_opens_think(const char *prompt) {
    const char *open = NULL, *q = prompt;
    while ((q = strstr(q, "<think>"))) open = q++;
    return open && !strstr(open, "</think>");
}
