/*
 * test_chat_think.c — the <think> splitter of `cmf chat`
 * (tools/chat_think.c): markers split across streamed pieces, dimmed
 * reasoning on a terminal, tags passed through otherwise, prompts that
 * open the reasoning block themselves.
 */
#include "../../tools/chat_think.h"
#include "test.h"

/* Feed `pieces` (NULL-terminated) and return what was printed. */
static char *run(bool tty, bool start, const char *const *pieces) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) return NULL;
    chat_think t;
    chat_think_init(&t, f, tty, start);
    for (int i = 0; pieces[i]; i++) chat_think_feed(&t, pieces[i], strlen(pieces[i]));
    chat_think_finish(&t);
    fclose(f);
    return buf;
}

static void expect(bool tty, bool start, const char *const *pieces, const char *want) {
    char *got = run(tty, start, pieces);
    CHECK(got && strcmp(got, want) == 0, "got \"%s\", want \"%s\"", got ? got : "(null)", want);
    free(got);
}

int main(void) {
    const char *split[] = {"<thi", "nk>ab", "c</th", "ink>", "de<", "f", NULL};
    expect(false, false, split, "<think>abc</think>de<f");
    expect(true, false, split, "\x1b[2mab\x1b[0m\x1b[2mc\x1b[0mde<f");
    const char *inside[] = {"reason", "ing</think>\n\nanswer", NULL};
    expect(true, true, inside, "\x1b[2mreason\x1b[0m\x1b[2ming\x1b[0m\n\nanswer");
    const char *lt[] = {"a <b> <<think>x", NULL};
    expect(false, false, lt, "a <b> <<think>x");
    const char *tail[] = {"x</thi", NULL};
    expect(false, true, tail, "x</thi");
    CHECK(chat_prompt_opens_think("<|im_start|>assistant\n<think>\n"), "open think");
    CHECK(!chat_prompt_opens_think("<think>\n\n</think>\n\n"), "closed think");
    CHECK(!chat_prompt_opens_think("plain"), "no think");
    return test_done();
}
