/*
 * chat_think.h — show a thinking model's reasoning apart from its answer
 * (chat_think.c): text between <think> and </think> is dimmed on a
 * terminal (ANSI SGR 2) and passed through with its tags otherwise.
 * Markers split across streamed pieces are recognised.
 */
#ifndef CMF_CLI_CHAT_THINK_H
#define CMF_CLI_CHAT_THINK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

typedef struct chat_think {
    FILE *out;
    bool tty;          /* dim the reasoning (else print the tags as text) */
    bool thinking;     /* inside <think> ... </think> */
    char pending[16];  /* bytes that may start a marker */
    size_t npending;
} chat_think;

void chat_think_init(chat_think *t, FILE *out, bool tty, bool start_thinking);
void chat_think_feed(chat_think *t, const char *text, size_t n);
/* Print what is held back and reset the style. */
void chat_think_finish(chat_think *t);
/* Does a rendered prompt end inside an open <think> block (the template
 * started the reasoning, e.g. Qwen3/Nanbeige add "<think>\n")? */
bool chat_prompt_opens_think(const char *prompt);

#endif /* CMF_CLI_CHAT_THINK_H */
