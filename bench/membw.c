/*
 * membw.c — `membw [-t N] [-s MiB] [-r RUNS]`: print the machine's memory
 * read bandwidth (GB/s, 1e9 bytes/s) measured by cmf_membw_probe, the
 * roofline reference of bench/llama_1b.sh and bench/matmul_bench.c.
 */
#include "membw.h"

#include "backend/cpu/cpu.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
    int threads = 0, runs = 5;
    long mib = 1024;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-t") == 0 && i + 1 < argc) threads = atoi(argv[++i]);
        else if (strcmp(argv[i], "-s") == 0 && i + 1 < argc) mib = atol(argv[++i]);
        else if (strcmp(argv[i], "-r") == 0 && i + 1 < argc) runs = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: membw [-t THREADS] [-s MIB] [-r RUNS]\n");
            return 2;
        }
    }
    if (threads <= 0) threads = cmf_cpu_physical_cores();
    if (mib < 1 || runs < 1) {
        fprintf(stderr, "membw: -s and -r must be >= 1\n");
        return 2;
    }
    const char *how = "";
    double bw = cmf_membw_probe((size_t)mib << 20, threads, runs, &how);
    if (bw <= 0) {
        fprintf(stderr, "membw: could not allocate %ld MiB\n", mib);
        return 1;
    }
    printf("membw: %.2f GB/s read (%d threads, %s, %ld MiB, best of %d)\n", bw / 1e9, threads, how,
           mib, runs);
    return 0;
}
