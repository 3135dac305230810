/*
 * test.h — the few macros every cmf test uses. A test is a plain C program:
 * exit 0 = pass, 1 = fail, 77 = skipped (ctest SKIP_RETURN_CODE), e.g. when
 * ../shared/data is absent. CHECK keeps going and counts failures so one run
 * reports every broken case.
 */
#ifndef CMF_TEST_H
#define CMF_TEST_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static int test_failures = 0;
static int test_checks = 0;

#define CHECK(cond, ...)                                                        \
    do {                                                                        \
        test_checks++;                                                          \
        if (!(cond)) {                                                          \
            test_failures++;                                                    \
            fprintf(stderr, "%s:%d: CHECK(%s) failed: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                       \
            fputc('\n', stderr);                                                \
        }                                                                       \
    } while (0)

/* Require: stop the test now on failure. */
#define REQUIRE(cond, ...)                                                      \
    do {                                                                        \
        test_checks++;                                                          \
        if (!(cond)) {                                                          \
            test_failures++;                                                    \
            fprintf(stderr, "%s:%d: REQUIRE(%s) failed: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                       \
            fputc('\n', stderr);                                                \
            return test_done();                                                 \
        }                                                                       \
    } while (0)

#define TEST_SKIP(...)                                                          \
    do {                                                                        \
        fprintf(stderr, "SKIP: ");                                              \
        fprintf(stderr, __VA_ARGS__);                                           \
        fputc('\n', stderr);                                                    \
        return 77;                                                              \
    } while (0)

/* A uniform float in [-1, 1) from the xorshift64 state *s (Marsaglia 2003,
 * shifts 13/7/17; the top 53 bits scaled): the tests' shared random
 * source, one state per test file so each file's stream is its own. */
static inline float test_frand(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return (float)((double)(*s >> 11) / 4503599627370496.0 - 1.0);
}

static inline int test_done(void) {
    fprintf(stderr, "%d checks, %d failed\n", test_checks, test_failures);
    return test_failures ? 1 : 0;
}

/* Path of ../shared/data beside the checkout (or $CMF_SHARED_DATA), or NULL
 * when it is absent. */
static inline const char *test_shared_data(void) {
    static char buf[4096];
    const char *env = getenv("CMF_SHARED_DATA");
    if (env && *env) snprintf(buf, sizeof buf, "%s", env);
    else snprintf(buf, sizeof buf, "%s/../shared/data", CMF_SOURCE_DIR);
    struct stat st;
    if (stat(buf, &st) != 0 || !S_ISDIR(st.st_mode)) return NULL;
    return buf;
}

/* A scratch directory for this test's output files (created). */
static inline const char *test_tmp_dir(const char *name) {
    static char buf[4096];
    snprintf(buf, sizeof buf, "%s/tmp_%s", CMF_BINARY_DIR, name);
    mkdir(buf, 0755);
    return buf;
}

#endif /* CMF_TEST_H */
