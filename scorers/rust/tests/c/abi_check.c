/* abi_check: a C host of libreplaylab_scorer through include/replaylab.h
 * (tests/scorers/test_c_abi.py compiles it against the header and the library).
 *
 *   abi_check DEMAND_DIR ROUTER_DIR BINDER_CONFIG_JSON < commands
 *
 * One command a line, one answer a line (the JSON, or "ERR <code> <rl_last_error>"):
 *   H <now_ms> <request json>      rl_demand_hint_json_at
 *   R <request json>               rl_router_route_json
 *   E <category|-> <prompt_tokens|nan> <v1,v2,...>   rl_router_route_embedding
 *   B <turn json>                  rl_binder_bind_json
 *   F <session id>                 rl_binder_report_failure (prints its code)
 *   S                              rl_binder_stats_json
 *   T <threads> <request json>     rl_router_route_json from <threads> threads at once,
 *                                  200 calls each: "same" when every answer equals one
 * Every call first gets a 1-byte buffer: the size it returns must be the answer's + 1
 * (a binder turn: at least that, and the turn applied once).
 * Before the commands it checks the error conventions and prints "conventions ok".
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "replaylab.h"

#define FAIL(...) do { fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); exit(1); } while (0)

/* call f(ctx, out, cap) with a 1-byte buffer, then the size it asks for */
typedef int (*call_fn)(void *ctx, char *out, size_t cap);

static int bound_only; /* the binder asks for an upper bound, not the exact size */

static char *answer(call_fn f, void *ctx, int *rc) {
    char small[1];
    int need = f(ctx, small, sizeof small);
    if (need <= 0) { *rc = need; return NULL; }
    char *buf = malloc((size_t)need);
    int again = f(ctx, buf, (size_t)need);
    if (again != 0) FAIL("a buffer of the size asked for (%d) answered %d", need, again);
    if (bound_only ? strlen(buf) + 1 > (size_t)need : strlen(buf) + 1 != (size_t)need) FAIL("asked for %d bytes, wrote %zu", need, strlen(buf) + 1);
    *rc = 0;
    return buf;
}

static rl_demand *demand;
static rl_router *router;
static rl_binder *binder;

struct hint_ctx { const char *json; int64_t now_ms; };
static int call_hint(void *c, char *out, size_t cap) {
    struct hint_ctx *h = c;
    return rl_demand_hint_json_at(demand, h->json, h->now_ms, out, cap);
}
static int call_route(void *c, char *out, size_t cap) { return rl_router_route_json(router, c, out, cap); }
static int call_bind(void *c, char *out, size_t cap) { return rl_binder_bind_json(binder, c, out, cap); }
static int call_stats(void *c, char *out, size_t cap) { (void)c; return rl_binder_stats_json(binder, out, cap); }
struct emb_ctx { float *v; size_t n; const char *category; double tokens; };
static int call_emb(void *c, char *out, size_t cap) {
    struct emb_ctx *e = c;
    return rl_router_route_embedding(router, e->v, e->n, e->category, e->tokens, out, cap);
}

static void print_answer(char *a, int rc) {
    if (a) { puts(a); free(a); }
    else printf("ERR %d %s\n", rc, rl_last_error() ? rl_last_error() : "(no message)");
}

static void conventions(void) {
    char buf[4096];
    if (rl_router_route_json(NULL, "{\"text\":\"x\"}", buf, sizeof buf) != RL_ERR_NULL || !rl_last_error())
        FAIL("a NULL router handle is not RL_ERR_NULL with a message");
    if (rl_router_route_json(router, "{\"text\":", buf, sizeof buf) != RL_ERR_INPUT || !rl_last_error())
        FAIL("JSON cut short is not RL_ERR_INPUT with a message");
    if (rl_router_route_json(router, "{\"text\":3}", buf, sizeof buf) != RL_ERR_INPUT)
        FAIL("a text that is not a string is not RL_ERR_INPUT");
    if (rl_router_route_json(router, "{\"text\":\"hello\"}", buf, sizeof buf) != 0 || rl_last_error())
        FAIL("a good route left an error or failed: %s", rl_last_error());
    int need = rl_router_route_json(router, "{\"text\":\"hello\"}", NULL, 0);
    if (need != (int)strlen(buf) + 1) FAIL("out NULL: %d, not the size needed %zu", need, strlen(buf) + 1);
    if (rl_demand_hint_json(demand, "[1,2", buf, sizeof buf) != RL_ERR_INPUT) FAIL("bad demand JSON");
    if (rl_demand_hint_json(demand, "[]", buf, sizeof buf) != 0 || !strstr(buf, "\"bad_request\""))
        FAIL("a request that is not an object is not the bad_request fallback hint: %s", buf);
    rl_binder *own = rl_binder_new(router, NULL);
    if (!own || rl_binder_report_failure(own, "never-seen") != 0) FAIL("an unknown session escalated");
    if (rl_binder_bind_json(own, "{\"session_id\":\"s\",\"now\":\"noon\"}", buf, sizeof buf) != RL_ERR_INPUT)
        FAIL("a turn whose now is not a number is not RL_ERR_INPUT");
    rl_binder_free(own);
    if (rl_router_load("/nonexistent/artifact", 0) != NULL || !rl_last_error()) FAIL("a missing folder loaded");
    if (rl_binder_new(NULL, "{}") != NULL || !rl_last_error()) FAIL("a binder without router or fallback");
    rl_binder *fb = rl_binder_new(NULL, "{\"fallback_candidate\":\"strong\"}");
    if (!fb || rl_binder_bind_json(fb, "{\"session_id\":\"s\",\"now\":0}", buf, sizeof buf) != 0
        || !strstr(buf, "\"router_not_loaded\"")) FAIL("a binder without router: %s", buf);
    rl_binder_free(fb);
    rl_demand_free(NULL);
    rl_router_free(NULL);
    rl_binder_free(NULL);
    puts("conventions ok");
}

struct thread_job { const char *json; const char *want; int ok; };
static void *route_many(void *p) {
    struct thread_job *j = p;
    char buf[65536];
    j->ok = 1;
    for (int i = 0; i < 200; i++)
        if (rl_router_route_json(router, j->json, buf, sizeof buf) != 0 || strcmp(buf, j->want) != 0) j->ok = 0;
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 4) FAIL("usage: abi_check DEMAND_DIR ROUTER_DIR BINDER_CONFIG_JSON < commands");
    demand = rl_demand_load(argv[1], 0);
    if (!demand) FAIL("demand load: %s", rl_last_error());
    router = rl_router_load(argv[2], 0);
    if (!router) FAIL("router load: %s", rl_last_error());
    binder = rl_binder_new(router, argv[3]);
    if (!binder) FAIL("binder: %s", rl_last_error());
    conventions();
    size_t cap = 1 << 20;
    char *line = malloc(cap);
    int rc;
    while (fgets(line, (int)cap, stdin)) {
        line[strcspn(line, "\n")] = 0;
        char *rest = line + 2;
        switch (line[0]) {
        case 'H': {
            struct hint_ctx h;
            h.now_ms = strtoll(rest, &rest, 10);
            h.json = rest + 1;
            { char *a = answer(call_hint, &h, &rc); print_answer(a, rc); };
            break;
        }
        case 'R': { char *a = answer(call_route, rest, &rc); print_answer(a, rc); }; break;
        case 'B':
            bound_only = 1;
            { char *a = answer(call_bind, rest, &rc); print_answer(a, rc); };
            bound_only = 0;
            break;
        case 'S': { char *a = answer(call_stats, NULL, &rc); print_answer(a, rc); }; break;
        case 'F': printf("%d\n", rl_binder_report_failure(binder, rest)); break;
        case 'E': {
            struct emb_ctx e;
            char *cat = strtok(rest, " "), *tok = strtok(NULL, " "), *vals = strtok(NULL, " ");
            e.category = strcmp(cat, "-") == 0 ? NULL : cat;
            e.tokens = strtod(tok, NULL);
            e.v = malloc(sizeof(float) * 4096);
            e.n = 0;
            for (char *v = strtok(vals, ","); v && e.n < 4096; v = strtok(NULL, ",")) e.v[e.n++] = strtof(v, NULL);
            { char *a = answer(call_emb, &e, &rc); print_answer(a, rc); };
            free(e.v);
            break;
        }
        case 'T': {
            int n = (int)strtol(rest, &rest, 10);
            struct thread_job jobs[64];
            pthread_t tid[64];
            char *want = answer(call_route, rest + 1, &rc);
            if (!want || n < 1 || n > 64) FAIL("T: %s", rl_last_error());
            for (int i = 0; i < n; i++) {
                jobs[i].json = rest + 1;
                jobs[i].want = want;
                pthread_create(&tid[i], NULL, route_many, &jobs[i]);
            }
            int all = 1;
            for (int i = 0; i < n; i++) { pthread_join(tid[i], NULL); all &= jobs[i].ok; }
            puts(all ? "same" : "differ");
            free(want);
            break;
        }
        default: FAIL("unknown command %c", line[0]);
        }
        fflush(stdout);
    }
    free(line);
    rl_router_free(router); /* the binder keeps its own reference */
    char buf[4096];
    if (rl_binder_stats_json(binder, buf, sizeof buf) != 0) FAIL("the binder after rl_router_free");
    rl_binder_free(binder);
    rl_demand_free(demand);
    return 0;
}
