/*
 * cpu_features.c — run-time CPU feature detection and kernel-level choice.
 *
 * x86-64: CPUID leaves 1 and 7 (Intel SDM vol. 2A, "CPUID") plus XGETBV to
 * check that the OS saves ymm (XCR0 bits 1,2) and zmm/opmask state (bits
 * 5,6,7). arm64: NEON is architectural; dot product and FP16 come from
 * getauxval(AT_HWCAP) (Linux arch/arm64/include/uapi/asm/hwcap.h).
 *
 * Everything here is a pure read: nothing is cached (no global state).
 * Each call of cmf_cpu_detect_features asks the CPU again; a thread pool
 * (pool.c) reads features and CMF_CPU once at creation and keeps its
 * level, so a device's kernels see one level for its whole life.
 * AMX (Intel SDM vol. 1, ch. 18 "Intel AMX"; Linux
 * Documentation/arch/x86/xstate.rst): CPUID.(7,0):EDX bits 22 (AMX-BF16),
 * 24 (AMX-TILE), 25 (AMX-INT8), XCR0 bits 17/18 (the OS saves XTILECFG /
 * XTILEDATA), and since Linux 5.16 a process must ask for the tile data
 * state with arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) before
 * its first tile instruction (else SIGILL). Detection asks (idempotent,
 * process-wide: a permission, not state of ours); a refusal (older kernel,
 * a sandbox that does not pass it on) leaves the AMX bits clear, so the
 * level falls back to avx512gfni/avx512vnni. Level amx also asks for GFNI
 * and AVX512-VBMI (CPUID.(7,0):ECX bits 8 and 1), which every CPU with AMX
 * has: its activation quantizers use vpermt2b (gemm_avx512.c).
 * CMF_CPU=<level name> forces a level (capped by what the CPU has). Also
 * counts physical cores for the default thread count.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "backend/cpu/cpu.h"

#include <sched.h>
#include <stdio.h>
#if defined(__linux__)
#include <sys/syscall.h>
#endif
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#if defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#endif

#if defined(__x86_64__) || defined(__i386__)
static unsigned long long xgetbv0(void) {
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((unsigned long long)hi << 32) | lo;
}

/* Ask Linux for the AMX tile data state (ARCH_REQ_XCOMP_PERM = 0x1023,
 * XFEATURE_XTILEDATA = 18; granted once per process, asking again is a
 * no-op); false where it is refused or not Linux. */
static bool amx_permit(void) {
#if defined(CMF_AMX_EMULATE)
    return true; /* gemm_avx512.c emulates the tiles (developer build) */
#elif defined(__linux__) && defined(SYS_arch_prctl)
    return syscall(SYS_arch_prctl, 0x1023, 18) == 0;
#else
    return false;
#endif
}

static unsigned detect(void) {
    unsigned a, b, c, d, f = 0;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return 0;
    bool osxsave = (c >> 27) & 1, fma = (c >> 12) & 1, f16c = (c >> 29) & 1;
    if (!osxsave) return 0;
    unsigned long long xcr0 = xgetbv0();
    bool ymm_ok = (xcr0 & 0x6) == 0x6, zmm_ok = (xcr0 & 0xe6) == 0xe6;
    unsigned max = __get_cpuid_max(0, NULL);
    if (max < 7) return 0;
    __cpuid_count(7, 0, a, b, c, d);
    bool avx2 = (b >> 5) & 1;
    bool f512 = (b >> 16) & 1, dq = (b >> 17) & 1, bw = (b >> 30) & 1, vl = (b >> 31) & 1;
    bool vnni = (c >> 11) & 1, gfni = (c >> 8) & 1, vbmi = (c >> 1) & 1;
    bool amx_bf16 = (d >> 22) & 1, amx_tile = (d >> 24) & 1, amx_int8 = (d >> 25) & 1;
    bool tile_ok = (xcr0 & 0x60000) == 0x60000;
    unsigned a1, b1, c1, d1;
    __cpuid_count(7, 1, a1, b1, c1, d1);
    bool bf16 = (a1 >> 5) & 1;
    (void)b1; (void)c1; (void)d1;
    if (ymm_ok && avx2 && fma && f16c) f |= CMF_CPU_F_AVX2;
    if ((f & CMF_CPU_F_AVX2) && zmm_ok && f512 && dq && bw && vl) {
        f |= CMF_CPU_F_AVX512;
        if (vnni) f |= CMF_CPU_F_AVX512VNNI;
        if (bf16) f |= CMF_CPU_F_AVX512BF16;
        if (gfni) f |= CMF_CPU_F_GFNI;
        if (vbmi) f |= CMF_CPU_F_VBMI;
#if defined(CMF_AMX_EMULATE)
        amx_tile = amx_int8 = tile_ok = true;
#endif
        if (amx_tile && amx_int8 && tile_ok && amx_permit()) {
            f |= CMF_CPU_F_AMXINT8;
            if (amx_bf16) f |= CMF_CPU_F_AMXBF16;
        }
    }
    return f;
}
#elif defined(__aarch64__)
static unsigned detect(void) {
    unsigned f = CMF_CPU_F_NEON;
#if defined(__linux__)
    unsigned long hw = getauxval(AT_HWCAP);
    if (hw & (1ul << 20)) f |= CMF_CPU_F_DOTPROD; /* HWCAP_ASIMDDP */
    if (hw & (1ul << 10)) f |= CMF_CPU_F_FP16;    /* HWCAP_ASIMDHP */
#endif
    return f;
}
#else
static unsigned detect(void) { return 0; }
#endif

unsigned cmf_cpu_detect_features(void) { return detect(); }

cmf_cpu_level cmf_cpu_level_cap(unsigned f, cmf_cpu_level cap) {
#if defined(__aarch64__)
    if (cap >= CMF_CPU_NEONDOT && (f & CMF_CPU_F_DOTPROD)) return CMF_CPU_NEONDOT;
    if (cap >= CMF_CPU_NEON && (f & CMF_CPU_F_NEON)) return CMF_CPU_NEON;
#else
    if (cap == CMF_CPU_AMX && (f & CMF_CPU_F_AMXINT8) && (f & CMF_CPU_F_AVX512VNNI) &&
        (f & CMF_CPU_F_GFNI) && (f & CMF_CPU_F_VBMI)) /* every AMX CPU has GFNI and VBMI */
        return CMF_CPU_AMX;
    if (cap > CMF_CPU_AVX512GFNI) cap = CMF_CPU_AVX512GFNI;
    if (cap >= CMF_CPU_AVX512GFNI && (f & CMF_CPU_F_AVX512VNNI) && (f & CMF_CPU_F_GFNI))
        return CMF_CPU_AVX512GFNI;
    if (cap >= CMF_CPU_AVX512VNNI && (f & CMF_CPU_F_AVX512VNNI)) return CMF_CPU_AVX512VNNI;
    if (cap >= CMF_CPU_AVX512 && (f & CMF_CPU_F_AVX512)) return CMF_CPU_AVX512;
    if (cap >= CMF_CPU_AVX2 && (f & CMF_CPU_F_AVX2)) return CMF_CPU_AVX2;
#endif
    return CMF_CPU_REF;
}

static const char *const k_names[] = {"ref", "avx2", "avx512", "avx512vnni", "avx512gfni", "neon", "neondot", "amx"};

cmf_cpu_level cmf_cpu_level_choose(unsigned features, const char *env_cmf_cpu) {
    cmf_cpu_level cap = CMF_CPU_AMX; /* unset, empty or unknown: the best */
    if (env_cmf_cpu && *env_cmf_cpu) {
        for (int i = 0; i < (int)(sizeof k_names / sizeof k_names[0]); i++)
            if (strcmp(env_cmf_cpu, k_names[i]) == 0) cap = (cmf_cpu_level)i;
    }
    return cmf_cpu_level_cap(features, cap);
}

cmf_cpu_level cmf_cpu_level_detect(void) {
    return cmf_cpu_level_choose(cmf_cpu_detect_features(), getenv("CMF_CPU"));
}

const char *cmf_cpu_level_name(cmf_cpu_level l) {
    if ((int)l < 0 || (int)l >= (int)(sizeof k_names / sizeof k_names[0])) return "unknown";
    return k_names[l];
}

/* Read one small integer file; -1 if absent. */
static long read_long(const char *path) {
    FILE *fp = fopen(path, "r");
    if (!fp) return -1;
    long v = -1;
    if (fscanf(fp, "%ld", &v) != 1) v = -1;
    fclose(fp);
    return v;
}

/* One logical CPU per physical core among the CPUs this thread may run on
 * (the lowest-numbered sibling of each (package, core) pair, from sysfs),
 * in increasing CPU order into cpus[0 .. max); returns the count, 0 when
 * sysfs has no topology. */
static int core_cpus(int *cpus, int max) {
    cpu_set_t set;
    bool have_aff = sched_getaffinity(0, sizeof set, &set) == 0;
    enum { MAXC = 1024 };
    long keys[MAXC];
    int nkeys = 0;
    for (int cpu = 0; cpu < MAXC; cpu++) {
        char path[128];
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu%d/topology/core_id", cpu);
        long core = read_long(path);
        if (core < 0) break;
        if (have_aff && !CPU_ISSET(cpu, &set)) continue;
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu%d/topology/physical_package_id",
                 cpu);
        long pkg = read_long(path);
        long key = (pkg < 0 ? 0 : pkg) * 1000000 + core;
        bool seen = false;
        for (int k = 0; k < nkeys; k++) seen |= keys[k] == key;
        if (seen || nkeys >= MAXC) continue;
        if (nkeys < max) cpus[nkeys] = cpu;
        keys[nkeys++] = key;
    }
    return nkeys < max ? nkeys : max;
}

int cmf_cpu_core_cpus(int *cpus, int max) { return max > 0 && cpus ? core_cpus(cpus, max) : 0; }

int cmf_cpu_physical_cores(void) {
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    if (ncpu < 1) ncpu = 1;
    enum { MAXC = 1024 };
    int cpus[MAXC];
    int nkeys = core_cpus(cpus, MAXC);
    if (nkeys > 0) return nkeys;
    long keys[MAXC];
    /* /proc/cpuinfo: count distinct "physical id"/"core id" pairs. */
    FILE *fp = fopen("/proc/cpuinfo", "r");
    if (fp) {
        char line[256];
        long pkg = 0;
        nkeys = 0;
        while (fgets(line, sizeof line, fp)) {
            long v;
            if (sscanf(line, "physical id : %ld", &v) == 1) pkg = v;
            else if (sscanf(line, "core id : %ld", &v) == 1) {
                long key = pkg * 1000000 + v;
                bool seen = false;
                for (int k = 0; k < nkeys; k++) seen |= keys[k] == key;
                if (!seen && nkeys < MAXC) keys[nkeys++] = key;
            }
        }
        fclose(fp);
        if (nkeys > 0) return nkeys;
    }
    return (int)ncpu;
}
