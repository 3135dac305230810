/*
 * bigint.c — Python ints beyond 64 bits for the template engine: a
 * JV_BIGINT value carries its exact decimal text (context JSON such as
 * 12345678901234567890, literals, int64 overflow in arithmetic), so that
 * printing and tojson reproduce it unchanged, comparisons with ints and
 * floats are exact, and + - * // % ** give Python's exact results.
 *
 * Arithmetic converts the text to base-10^9 limbs (little-endian) on the
 * render heap, computes with schoolbook algorithms, and converts back: a
 * result that fits int64 becomes a JV_INT again. Sizes are bounded by
 * JBIG_MAX_DIGITS (Python's default limit on int/str conversion, 4300
 * digits); larger values are a CMF_ERR_LIMIT render error, and so is more
 * than JBIG_MAX_WORK limb operations in one render (schoolbook costs grow
 * with the square of the size: this bounds the time a template can spend).
 */
#include "jinja.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BASE 1000000000u
#define BASE_DIGITS 9
#define JBIG_MAX_WORK ((uint64_t)100000000)

typedef struct bn {
    uint32_t *d; /* limbs, least significant first; no zero limbs on top */
    size_t n;    /* 0: the value zero */
    bool neg;
} bn;

/* Count n limb operations against the render's budget. */
static bool charge(jrt *rt, uint64_t n) {
    rt->big_work += n;
    if (rt->big_work <= JBIG_MAX_WORK) return jrt_charge(rt, n / JWORK_BYTES);
    jrt_fail(rt, CMF_ERR_LIMIT, "big-integer arithmetic exceeds %llu limb operations", (unsigned long long)JBIG_MAX_WORK);
    return false;
}

static bool bn_new(jrt *rt, bn *x, size_t cap) {
    x->d = jrt_alloc(rt, (cap ? cap : 1) * sizeof(uint32_t));
    x->n = 0;
    x->neg = false;
    return x->d != NULL;
}

static size_t trim_limbs(const uint32_t *d, size_t n) {
    while (n && !d[n - 1]) n--;
    return n;
}

static void bn_trim(bn *x) {
    x->n = trim_limbs(x->d, x->n);
    if (!x->n) x->neg = false;
}

/* ---- decimal text ------------------------------------------------------ */

/* Signed comparison of canonical decimal texts ("-"? digits, no leading
 * zeros, "0" for zero). */
static int dec_cmp(const char *a, size_t an, const char *b, size_t bn_) {
    bool na = an && a[0] == '-', nb = bn_ && b[0] == '-';
    if (na != nb) return na ? -1 : 1;
    if (na) { a++; an--; b++; bn_--; }
    int c = an != bn_ ? (an < bn_ ? -1 : 1) : memcmp(a, b, an);
    c = c < 0 ? -1 : c > 0 ? 1 : 0;
    return na ? -c : c;
}

static jv big_text(jrt *rt, const char *s, size_t n) {
    jv v = jv_str(rt, s, n);
    if (v.t == JV_STR) v.t = JV_BIGINT;
    return v;
}

bool jv_int_parse(jrt *rt, const char *s, size_t n, jv *out) {
    size_t i = 0;
    bool neg = false;
    if (i < n && (s[i] == '+' || s[i] == '-')) neg = s[i++] == '-';
    if (i == n) return false;
    for (size_t k = i; k < n; k++)
        if (s[k] < '0' || s[k] > '9') return false;
    while (i + 1 < n && s[i] == '0') i++;
    size_t nd = n - i;
    if (nd > JBIG_MAX_DIGITS) {
        jrt_fail(rt, CMF_ERR_LIMIT, "integer with more than %d digits", JBIG_MAX_DIGITS);
        return false;
    }
    if (nd <= 18) {
        int64_t v = 0;
        for (size_t k = i; k < n; k++) v = v * 10 + (s[k] - '0');
        *out = jv_int(neg ? -v : v);
        return true;
    }
    /* 19+ digits: compare with the int64 bounds as text */
    char buf[JBIG_MAX_DIGITS + 2];
    size_t o = 0;
    if (neg) buf[o++] = '-'; /* nd >= 19: not zero */
    memcpy(buf + o, s + i, nd);
    o += nd;
    if (dec_cmp(buf, o, "9223372036854775807", 19) <= 0 && dec_cmp(buf, o, "-9223372036854775808", 20) >= 0) {
        buf[o] = 0;
        *out = jv_int(strtoll(buf, NULL, 10));
        return true;
    }
    *out = big_text(rt, buf, o);
    return JRT_OK(rt);
}

/* ---- values <-> limbs ------------------------------------------------- */

static bool bn_of(jrt *rt, const jv *v, bn *x) {
    if (v->t == JV_BIGINT) {
        const char *s = v->u.s->s;
        size_t n = v->u.s->len, i = 0;
        bool neg = n && s[0] == '-';
        if (neg) i = 1;
        if (!bn_new(rt, x, (n - i) / BASE_DIGITS + 1)) return false;
        for (size_t end = n; end > i;) { /* 9-digit chunks from the right */
            size_t st = end - i > BASE_DIGITS ? end - BASE_DIGITS : i;
            uint32_t limb = 0;
            for (size_t k = st; k < end; k++) limb = limb * 10 + (uint32_t)(s[k] - '0');
            x->d[x->n++] = limb;
            end = st;
        }
        x->neg = neg;
        bn_trim(x);
        return true;
    }
    int64_t i = v->t == JV_INT ? v->u.i : v->t == JV_BOOL ? v->u.b : 0;
    uint64_t m = i < 0 ? (uint64_t)(-(i + 1)) + 1 : (uint64_t)i;
    if (!bn_new(rt, x, 3)) return false;
    while (m) {
        x->d[x->n++] = (uint32_t)(m % BASE);
        m /= BASE;
    }
    x->neg = i < 0;
    return true;
}

static jv bn_to_jv(jrt *rt, const bn *x) {
    if (x->n <= 3) { /* < 10^27: try int64 */
        uint64_t m = 0;
        bool fits = true;
        for (size_t k = x->n; k-- > 0 && fits;) {
            if (m > (UINT64_MAX - x->d[k]) / BASE) fits = false;
            else m = m * BASE + x->d[k];
        }
        if (fits && !x->neg && m <= (uint64_t)INT64_MAX) return jv_int((int64_t)m);
        if (fits && x->neg && m <= (uint64_t)INT64_MAX + 1) return jv_int(m ? -(int64_t)(m - 1) - 1 : 0);
    }
    size_t cap = x->n * BASE_DIGITS + 2;
    if (cap > JBIG_MAX_DIGITS + 2 + BASE_DIGITS)
        return jrt_fail(rt, CMF_ERR_LIMIT, "integer with more than %d digits", JBIG_MAX_DIGITS);
    char *buf = jrt_alloc(rt, cap + 1);
    if (!buf) return jv_undef();
    int o = 0;
    if (x->neg) buf[o++] = '-';
    o += snprintf(buf + o, cap + 1 - (size_t)o, "%u", x->d[x->n - 1]);
    for (size_t k = x->n - 1; k-- > 0;) o += snprintf(buf + o, cap + 1 - (size_t)o, "%09u", x->d[k]);
    if (o - (x->neg ? 1 : 0) > JBIG_MAX_DIGITS)
        return jrt_fail(rt, CMF_ERR_LIMIT, "integer with more than %d digits", JBIG_MAX_DIGITS);
    return big_text(rt, buf, (size_t)o);
}

/* ---- magnitudes ------------------------------------------------------- */

static int raw_cmp(const uint32_t *a, size_t an, const uint32_t *b, size_t bn_) {
    if (an != bn_) return an < bn_ ? -1 : 1;
    for (size_t k = an; k-- > 0;)
        if (a[k] != b[k]) return a[k] < b[k] ? -1 : 1;
    return 0;
}

static bool mag_add(jrt *rt, bn *r, const bn *a, const bn *b) {
    size_t n = (a->n > b->n ? a->n : b->n) + 1;
    if (!charge(rt, n) || !bn_new(rt, r, n)) return false;
    uint32_t carry = 0;
    for (size_t k = 0; k < n; k++) {
        uint64_t s = (uint64_t)carry + (k < a->n ? a->d[k] : 0) + (k < b->n ? b->d[k] : 0);
        r->d[k] = (uint32_t)(s % BASE);
        carry = (uint32_t)(s / BASE);
    }
    r->n = n;
    return true;
}

/* a -= b in place on raw limbs (a >= b); returns a's new length. */
static size_t raw_sub(uint32_t *a, size_t an, const uint32_t *b, size_t bn_) {
    int64_t borrow = 0;
    for (size_t k = 0; k < an; k++) {
        int64_t d = (int64_t)a[k] - borrow - (k < bn_ ? b[k] : 0);
        borrow = d < 0;
        a[k] = (uint32_t)(d < 0 ? d + BASE : d);
    }
    return trim_limbs(a, an);
}

static bool mag_sub(jrt *rt, bn *r, const bn *a, const bn *b) { /* |a| >= |b| */
    if (!charge(rt, a->n) || !bn_new(rt, r, a->n)) return false;
    memcpy(r->d, a->d, a->n * sizeof(uint32_t));
    r->n = raw_sub(r->d, a->n, b->d, b->n);
    return true;
}

static bool mag_mul(jrt *rt, bn *r, const bn *a, const bn *b) {
    if ((a->n + b->n) * BASE_DIGITS > JBIG_MAX_DIGITS + 2 * BASE_DIGITS) {
        jrt_fail(rt, CMF_ERR_LIMIT, "integer with more than %d digits", JBIG_MAX_DIGITS);
        return false;
    }
    if (!charge(rt, (uint64_t)a->n * b->n) || !bn_new(rt, r, a->n + b->n)) return false;
    for (size_t i = 0; i < a->n; i++) {
        uint64_t carry = 0;
        for (size_t j = 0; j < b->n; j++) {
            uint64_t cur = r->d[i + j] + (uint64_t)a->d[i] * b->d[j] + carry;
            r->d[i + j] = (uint32_t)(cur % BASE);
            carry = cur / BASE;
        }
        r->d[i + b->n] = (uint32_t)carry;
    }
    r->n = a->n + b->n;
    return true;
}

/* out = b * m (out has b->n + 1 limbs); returns its length. */
static size_t raw_mul_small(uint32_t *out, const bn *b, uint32_t m) {
    uint64_t carry = 0;
    for (size_t k = 0; k < b->n; k++) {
        uint64_t cur = (uint64_t)b->d[k] * m + carry;
        out[k] = (uint32_t)(cur % BASE);
        carry = cur / BASE;
    }
    out[b->n] = (uint32_t)carry;
    return trim_limbs(out, b->n + 1);
}

/* Truncated division of magnitudes: |a| = q * |b| + r, b != 0. Long
 * division one limb at a time, each quotient limb found by bisection
 * between bounds from the leading limbs: with R = r / BASE^(bn-1) and
 * t = b's top limb, R / (t + 1) <= q <= R / t. */
static bool mag_divmod(jrt *rt, bn *q, bn *r, const bn *a, const bn *b) {
    if (!bn_new(rt, q, a->n) || !bn_new(rt, r, b->n + 1)) return false;
    uint32_t *tmp = jrt_alloc(rt, (b->n + 1) * sizeof(uint32_t));
    if (!tmp) return false;
    size_t rn = 0;
    for (size_t i = a->n; i-- > 0;) {
        memmove(r->d + 1, r->d, rn * sizeof(uint32_t)); /* r = r * BASE + a[i] */
        r->d[0] = a->d[i];
        rn = trim_limbs(r->d, rn + 1);
        uint64_t top = b->d[b->n - 1], R = 0; /* r < b * BASE: R has at most two limbs */
        for (size_t k = rn; k-- > b->n - 1;) R = R * BASE + r->d[k];
        uint64_t lo64 = R / (top + 1), hi64 = R / top;
        uint32_t lo = (uint32_t)(lo64 < BASE ? lo64 : BASE - 1), hi = (uint32_t)(hi64 < BASE ? hi64 : BASE - 1);
        while (lo < hi) {
            if (!charge(rt, b->n)) return false;
            uint32_t mid = lo + (hi - lo + 1) / 2;
            size_t tn = raw_mul_small(tmp, b, mid);
            if (raw_cmp(tmp, tn, r->d, rn) <= 0) lo = mid;
            else hi = mid - 1;
        }
        q->d[i] = lo;
        if (lo) rn = raw_sub(r->d, rn, tmp, raw_mul_small(tmp, b, lo));
    }
    q->n = a->n;
    bn_trim(q);
    r->n = rn;
    return true;
}

/* ---- signed arithmetic ------------------------------------------------ */

static bool bn_addsub(jrt *rt, bn *r, const bn *x, const bn *y, bool sub) {
    bool yneg = y->n && (sub ? !y->neg : y->neg);
    bool ok;
    if (x->neg == yneg) { ok = mag_add(rt, r, x, y); r->neg = x->neg; }
    else if (raw_cmp(x->d, x->n, y->d, y->n) >= 0) { ok = mag_sub(rt, r, x, y); r->neg = x->neg; }
    else { ok = mag_sub(rt, r, y, x); r->neg = yneg; }
    if (ok) bn_trim(r);
    return ok;
}

static bool bn_mul(jrt *rt, bn *r, const bn *x, const bn *y) {
    if (!mag_mul(rt, r, x, y)) return false;
    r->neg = x->neg != y->neg;
    bn_trim(r);
    return true;
}

/* x ** e for e >= 0 (negative exponents are floats: jv_big_binop). Square
 * and multiply; a too large result fails in mag_mul. */
static jv big_pow(jrt *rt, const bn *x, const jv *e) {
    if (e->t == JV_BIGINT) { /* only 0, 1 and -1 survive an exponent beyond 64 bits */
        if (!(x->n == 0 || (x->n == 1 && x->d[0] == 1)))
            return jrt_fail(rt, CMF_ERR_LIMIT, "integer with more than %d digits", JBIG_MAX_DIGITS);
        bool odd = (e->u.s->s[e->u.s->len - 1] - '0') & 1;
        return jv_int(x->n == 0 ? 0 : (x->neg && odd) ? -1 : 1);
    }
    uint64_t ex = e->t == JV_INT ? (uint64_t)e->u.i : (uint64_t)e->u.b;
    bn r, b = *x, t;
    if (!bn_new(rt, &r, 1)) return jv_undef();
    r.d[0] = 1;
    r.n = 1;
    while (ex) {
        if (ex & 1) {
            if (!bn_mul(rt, &t, &r, &b)) return jv_undef();
            r = t;
        }
        ex >>= 1;
        if (ex) {
            if (!bn_mul(rt, &t, &b, &b)) return jv_undef();
            b = t;
        }
    }
    return bn_to_jv(rt, &r);
}

jv jv_big_binop(jrt *rt, int op, const jv *a, const jv *b) {
    if (op == OP_POW && (b->t == JV_INT ? b->u.i < 0 : b->t == JV_BIGINT && b->u.s->s[0] == '-'))
        return jv_float(pow(jv_num_double(a), jv_num_double(b))); /* Python: int ** -n is a float */
    if (op == OP_DIV) {
        if (jv_num_double(b) == 0) return jrt_fail(rt, CMF_ERR_RENDER, "division by zero");
        return jv_float(jv_num_double(a) / jv_num_double(b));
    }
    bn x, y, r, q;
    if (!bn_of(rt, a, &x) || !bn_of(rt, b, &y)) return jv_undef();
    switch (op) {
    case OP_ADD: case OP_SUB:
        if (!bn_addsub(rt, &r, &x, &y, op == OP_SUB)) return jv_undef();
        return bn_to_jv(rt, &r);
    case OP_MUL:
        if (!bn_mul(rt, &r, &x, &y)) return jv_undef();
        return bn_to_jv(rt, &r);
    case OP_FDIV: case OP_MOD: {
        if (y.n == 0) return jrt_fail(rt, CMF_ERR_RENDER, "integer division or modulo by zero");
        if (!mag_divmod(rt, &q, &r, &x, &y)) return jv_undef();
        /* floor semantics: the remainder takes the divisor's sign */
        bool differ = x.neg != y.neg;
        q.neg = differ;
        r.neg = y.neg;
        if (differ && r.n) {
            bn one, t;
            if (!bn_new(rt, &one, 1)) return jv_undef();
            one.d[0] = 1;
            one.n = 1;
            q.neg = false;
            if (!mag_add(rt, &t, &q, &one)) return jv_undef();
            t.neg = true;
            q = t;
            bn ym = y;
            ym.neg = false;
            if (!mag_sub(rt, &t, &ym, &r)) return jv_undef();
            t.neg = y.neg;
            r = t;
        }
        bn_trim(&q);
        bn_trim(&r);
        return bn_to_jv(rt, op == OP_FDIV ? &q : &r);
    }
    case OP_POW: return big_pow(rt, &x, b);
    default: return jrt_fail(rt, CMF_ERR_INTERNAL, "bad integer operator %d", op);
    }
}

jv jv_big_neg(jrt *rt, const jv *a) {
    if (a->t == JV_BIGINT) {
        const char *s = a->u.s->s;
        size_t n = a->u.s->len;
        if (s[0] == '-') return big_text(rt, s + 1, n - 1); /* never fits: |big| > 2^63 */
        char *buf = jrt_alloc(rt, n + 2);
        if (!buf) return jv_undef();
        buf[0] = '-';
        memcpy(buf + 1, s, n);
        jv r;
        if (!jv_int_parse(rt, buf, n + 1, &r)) return jv_undef(); /* -2^63 is an int again */
        return r;
    }
    int64_t i = a->t == JV_INT ? a->u.i : a->t == JV_BOOL ? a->u.b : 0;
    if (i == INT64_MIN) return big_text(rt, "9223372036854775808", 19);
    return jv_int(-i);
}

/* ---- comparison and conversion ---------------------------------------- */

jv jv_int_of_double(jrt *rt, double f) {
    if (isnan(f)) return jrt_fail(rt, CMF_ERR_RENDER, "cannot convert float NaN to integer");
    if (isinf(f)) return jrt_fail(rt, CMF_ERR_RENDER, "cannot convert float infinity to integer");
    double t = trunc(f);
    if (t >= -9223372036854775808.0 && t < 9223372036854775808.0) return jv_int((int64_t)t);
    char buf[400]; /* %.0f of an integral double is exact */
    int n = snprintf(buf, sizeof buf, "%.0f", t);
    jv r;
    if (n <= 0 || (size_t)n >= sizeof buf || !jv_int_parse(rt, buf, (size_t)n, &r))
        return JRT_OK(rt) ? jrt_fail(rt, CMF_ERR_INTERNAL, "float to int conversion failed") : jv_undef();
    return r;
}

double jv_num_double(const jv *v) {
    switch (v->t) {
    case JV_FLOAT: return v->u.f;
    case JV_INT: return (double)v->u.i;
    case JV_BOOL: return v->u.b;
    case JV_BIGINT: return strtod(v->u.s->s, NULL); /* correctly rounded; +-inf beyond 1e308 */
    default: return 0;
    }
}

static bool big_neg(const jv *v) { return v->u.s->s[0] == '-'; }

int jv_int_cmp(const jv *a, const jv *b) {
    if (a->t == JV_BIGINT && b->t == JV_BIGINT) return dec_cmp(a->u.s->s, a->u.s->len, b->u.s->s, b->u.s->len);
    /* a JV_BIGINT lies outside the int64 range: its sign decides */
    if (a->t == JV_BIGINT) return big_neg(a) ? -1 : 1;
    if (b->t == JV_BIGINT) return big_neg(b) ? 1 : -1;
    int64_t x = a->t == JV_INT ? a->u.i : a->u.b, y = b->t == JV_INT ? b->u.i : b->u.b;
    return x < y ? -1 : x > y ? 1 : 0;
}

int jv_big_cmp_float(const jv *a, double f) {
    if (isnan(f)) return 0; /* as the float-float comparison (callers test equality apart) */
    if (isinf(f)) return f > 0 ? -1 : 1;
    double t = trunc(f);
    char buf[400]; /* %.0f of a double is exact: at most 309 digits */
    int n = snprintf(buf, sizeof buf, "%.0f", t);
    const char *p = buf;
    if (n == 2 && memcmp(buf, "-0", 2) == 0) { p = buf + 1; n = 1; }
    int c = dec_cmp(a->u.s->s, a->u.s->len, p, (size_t)n);
    if (c) return c;
    return f > t ? -1 : f < t ? 1 : 0;
}
