/*
 * progress.c — the importers' progress bar on stderr: tensors done, bytes
 * done, ETA. Drawn only when the caller says stderr is a terminal, at most
 * ten times a second; silent otherwise (the library prints only this bar,
 * when opts->progress asks for it, and the warnings of cmf_imp_warn).
 */
#include "import/import_internal.h"

#include <stdarg.h>

void cmf_imp_warn(const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "cmf: warning: %s\n", msg);
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static double elapsed(const cmf_imp_progress *p) {
    return now_s() - ((double)p->t0.tv_sec + (double)p->t0.tv_nsec * 1e-9);
}

static void draw(cmf_imp_progress *p) {
    double f = p->bytes_total ? (double)p->bytes_done / (double)p->bytes_total
               : p->n_total  ? (double)p->n_done / (double)p->n_total
                             : 1.0;
    int width = 30, fill = (int)(f * width + 0.5);
    double el = elapsed(p), eta = f > 0.0 ? el / f - el : 0.0;
    fprintf(stderr, "\r[");
    for (int i = 0; i < width; i++) fputc(i < fill ? '#' : ' ', stderr);
    fprintf(stderr, "] %zu/%zu tensors  %.2f/%.2f GB  ETA %d:%02d ", p->n_done, p->n_total,
            (double)p->bytes_done / 1e9, (double)p->bytes_total / 1e9, (int)eta / 60, (int)eta % 60);
    fflush(stderr);
}

void cmf_imp_progress_start(cmf_imp_progress *p, bool on, size_t n_total, uint64_t bytes_total) {
    p->on = on;
    p->n_total = n_total;
    p->n_done = 0;
    p->bytes_total = bytes_total;
    p->bytes_done = 0;
    p->last_draw = 0;
    clock_gettime(CLOCK_MONOTONIC, &p->t0);
    if (on) draw(p);
}

void cmf_imp_progress_step(cmf_imp_progress *p, uint64_t bytes) {
    p->n_done++;
    p->bytes_done += bytes;
    if (!p->on) return;
    double t = elapsed(p);
    if (t - p->last_draw < 0.1 && p->n_done < p->n_total) return;
    p->last_draw = t;
    draw(p);
}

void cmf_imp_progress_end(cmf_imp_progress *p) {
    if (!p->on) return;
    draw(p);
    fputc('\n', stderr);
}
