/* latency: the C host's per-call times through include/replaylab.h (make bench,
 * bench/bench_native.py): one route per line of QUERIES, then one hint per line of
 * REQUESTS (JSONL), each call timed alone with CLOCK_MONOTONIC.
 *
 *   latency ROUTER_DIR QUERIES.jsonl DEMAND_DIR REQUESTS.jsonl N
 *
 * Prints {"route": {"p50_us", "p99_us", "calls"}, "hint": {...}} on one line. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "replaylab.h"

static char **read_lines(const char *path, size_t *n) {
    FILE *f = fopen(path, "r");
    if (!f) { perror(path); exit(1); }
    size_t cap = 1 << 20, len = 0, room = 1024;
    char *buf = malloc(cap), **out = malloc(room * sizeof *out);
    while (fgets(buf, (int)cap, f)) {
        buf[strcspn(buf, "\n")] = 0;
        if (!buf[0]) continue;
        if (len == room) out = realloc(out, (room *= 2) * sizeof *out);
        out[len++] = strdup(buf);
    }
    fclose(f);
    free(buf);
    *n = len;
    return out;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static const rl_router *router;
static const rl_demand *demand;
static long long stamp_ms;
static char out[1 << 16];

static int route(const char *q) { return rl_router_route_json(router, q, out, sizeof out); }
static int hint(const char *q) { return rl_demand_hint_json_at(demand, q, stamp_ms, out, sizeof out); }

static void timed(const char *name, int (*call)(const char *), char **in, size_t n_in, int n, int last) {
    double *us = malloc(sizeof(double) * (size_t)n);
    for (int i = 0; i < 20; i++) call(in[i % n_in]);
    for (int i = 0; i < n; i++) {
        double t = now_us();
        if (call(in[i % n_in]) != 0) { fprintf(stderr, "%s: %s\n", name, rl_last_error()); exit(1); }
        us[i] = now_us() - t;
    }
    qsort(us, (size_t)n, sizeof *us, cmp);
    printf("\"%s\":{\"p50_us\":%.3f,\"p99_us\":%.3f,\"calls\":%d}%s", name, us[(int)(0.50 * (n - 1) + 0.5)],
           us[(int)(0.99 * (n - 1) + 0.5)], n, last ? "" : ",");
    free(us);
}

int main(int argc, char **argv) {
    if (argc != 6) { fprintf(stderr, "usage: latency ROUTER_DIR QUERIES DEMAND_DIR REQUESTS N\n"); return 2; }
    router = rl_router_load(argv[1], 0);
    demand = rl_demand_load(argv[3], 0);
    if (!router || !demand) { fprintf(stderr, "load: %s\n", rl_last_error()); return 1; }
    stamp_ms = (long long)time(NULL) * 1000;
    size_t nq, nr;
    char **q = read_lines(argv[2], &nq), **r = read_lines(argv[4], &nr);
    int n = atoi(argv[5]);
    printf("{");
    timed("route", route, q, nq, n, 0);
    timed("hint", hint, r, nr, n, 1);
    printf("}\n");
    return 0;
}
