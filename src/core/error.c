/*
 * error.c — the library's one error mechanism: a status code plus a message
 * that names the file, field or argument at fault (see cmf/core.h).
 */
#include "cmf/core.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

cmf_status cmf_error_set(cmf_error *err, cmf_status st, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        err->status = st;
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
    }
    return st;
}

cmf_status cmf_error_prefix(cmf_error *err, const char *fmt, ...) {
    if (!err) return CMF_ERR_INTERNAL;
    char prefix[CMF_ERROR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    if (n < 0) return err->status;
    size_t plen = strlen(prefix);
    if (plen + 2 >= sizeof err->msg) plen = sizeof err->msg - 3;
    size_t olen = strnlen(err->msg, sizeof err->msg - 1);
    if (plen + 2 + olen >= sizeof err->msg) olen = sizeof err->msg - 1 - plen - 2;
    /* msg = prefix ": " old (truncated to fit) */
    memmove(err->msg + plen + 2, err->msg, olen);
    memcpy(err->msg, prefix, plen);
    err->msg[plen] = ':';
    err->msg[plen + 1] = ' ';
    err->msg[plen + 2 + olen] = 0;
    return err->status;
}

const char *cmf_status_name(cmf_status st) {
    switch (st) {
    case CMF_OK: return "CMF_OK";
    case CMF_ERR_IO: return "CMF_ERR_IO";
    case CMF_ERR_FORMAT: return "CMF_ERR_FORMAT";
    case CMF_ERR_NOMEM: return "CMF_ERR_NOMEM";
    case CMF_ERR_ARG: return "CMF_ERR_ARG";
    case CMF_ERR_UNSUPPORTED: return "CMF_ERR_UNSUPPORTED";
    case CMF_ERR_HASH: return "CMF_ERR_HASH";
    case CMF_ERR_LIMIT: return "CMF_ERR_LIMIT";
    case CMF_ERR_CONTEXT_FULL: return "CMF_ERR_CONTEXT_FULL";
    case CMF_ERR_RENDER: return "CMF_ERR_RENDER";
    case CMF_ERR_NOT_FOUND: return "CMF_ERR_NOT_FOUND";
    case CMF_ERR_CANCELLED: return "CMF_ERR_CANCELLED";
    case CMF_ERR_INTERNAL: return "CMF_ERR_INTERNAL";
    }
    return "CMF_ERR_UNKNOWN";
}
