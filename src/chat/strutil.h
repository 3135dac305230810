/*
 * strutil.h — Python str operations on UTF-8 template strings (strutil.c).
 * All take/return JV_STR values allocated on the render heap.
 */
#ifndef CMF_CHAT_STRUTIL_H
#define CMF_CHAT_STRUTIL_H

#include "jinja.h"

enum { SU_UPPER, SU_LOWER, SU_TITLE, SU_CAPITALIZE, SU_SWAPCASE };

int32_t su_decode(const char *s, size_t n, size_t *i);
bool su_put_cp(jrt *rt, jbuf *b, int32_t cp);
bool su_isspace(int32_t c);
jv su_case(jrt *rt, const jv *s, int mode);
/* chars NULL: whitespace; else the set of code points in chars. */
jv su_strip(jrt *rt, const jv *s, const jv *chars, bool left, bool right);
/* sep NULL: split on whitespace runs; maxsplit < 0: no limit. */
jv su_split(jrt *rt, const jv *s, const jv *sep, int64_t maxsplit, bool from_right);
/* count < 0: all. */
jv su_replace(jrt *rt, const jv *s, const jv *old, const jv *rep, int64_t count);
jv su_splitlines(jrt *rt, const jv *s);
/* memmem(hay, n, needle, m) that charges the bytes it scanned to the
 * render's work budget (jrt_charge); NULL when absent or over budget. */
const char *su_find(jrt *rt, const char *hay, size_t n, const char *needle, size_t m);

#endif /* CMF_CHAT_STRUTIL_H */
