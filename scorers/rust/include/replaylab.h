/* replaylab.h: the C ABI of libreplaylab_scorer (scorers/rust, built by
 * `cargo build --release`: target/release/libreplaylab_scorer.so and .a).
 * Specification: docs/specs/c-abi.md; examples: docs/howto/serving.md.
 * Hand-written; tests/scorers/test_c_abi.py compiles a C program against it.
 *
 * Return codes of the int functions:
 *   0      success; the answer (JSON, NUL-terminated) is in out
 *   > 0    out is NULL or cap is too small: the buffer size needed, NUL included
 *          (nothing written; call again with a buffer that large)
 *   < 0    an error (RL_ERR_*); rl_last_error() says why, on the same thread
 * Loaders and constructors return NULL on error (rl_last_error() says why).
 * rl_demand and rl_router handles are immutable: share them across threads.
 * An rl_binder is locked inside: any number of threads may call it.
 * No Rust panic crosses the boundary (RL_ERR_PANIC).
 */
#ifndef REPLAYLAB_H
#define REPLAYLAB_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define RL_ERR_NULL        (-1) /* a NULL handle or argument */
#define RL_ERR_INPUT       (-2) /* input not UTF-8, not JSON, or a field of the wrong type */
#define RL_ERR_PANIC       (-3) /* a panic caught at the boundary (a bug) */
#define RL_ERR_TOO_LARGE   (-4) /* an answer longer than INT_MAX bytes */
#define RL_ERR_UNSUPPORTED (-5) /* this handle cannot answer this call (tier, dimension) */
#define RL_ERR_STATE       (-6) /* a binder poisoned by an earlier panic; a failed load */
#define RL_ERR_DRIFT       (-7) /* the host's encoder misses the artifact's golden embeddings */

typedef struct rl_demand rl_demand;
typedef struct rl_router rl_router;
typedef struct rl_binder rl_binder;

/* This thread's last error ("<reason>: <message>"), or NULL after a successful call.
 * Valid until this thread's next rl_* call. */
const char *rl_last_error(void);

/* Demand hints. now_s: seconds since the Unix epoch for the validity check (<= 0: now).
 * request_json: the dict DemandPredictor.predict takes. The answer: the hint line of
 * `replaylab-route demand` ({"request_id", "hint_p50", "hint_p90", "hint_lo", ...}). */
rl_demand *rl_demand_load(const char *dir, double now_s);
int rl_demand_hint_json(const rl_demand *d, const char *request_json, char *out, size_t cap);
/* the same with the clock given: now_ms stamps a request without "timestamp" */
int rl_demand_hint_json_at(const rl_demand *d, const char *request_json, int64_t now_ms,
                           char *out, size_t cap);
void rl_demand_free(rl_demand *d);

/* Routing. A static-tier artifact routes text and embeddings; a MiniLM-tier one routes
 * embeddings only (rl_router_route_json answers RL_ERR_UNSUPPORTED).
 * request_json: {"text", "category", "prompt_tokens"}. The answer: the line of
 * `replaylab-route route` ({"candidate", "success_prob", "margin", "token_ids"}). */
rl_router *rl_router_load(const char *dir, double now_s);
int rl_router_route_json(const rl_router *r, const char *request_json, char *out, size_t cap);
/* emb: dim floats, the host's own embedding of the prompt (the artifact's encoder; see
 * docs/specs/router-scorer.md); category NULL: none; prompt_tokens NaN: unknown.
 * A wrong dim: RL_ERR_UNSUPPORTED; a NaN or infinite value: RL_ERR_INPUT. */
int rl_router_route_embedding(const rl_router *r, const float *emb, size_t dim,
                              const char *category, double prompt_tokens, char *out, size_t cap);
/* Proving the host's encoder (a MiniLM-tier artifact's golden triples): embed each text
 * of rl_router_golden_texts_json ([{"text", "category", "prompt_tokens"}, ...]) and pass
 * the n x dim row-major floats; 0 and the summary when they match within golden.json's
 * tolerances, RL_ERR_DRIFT (summary in rl_last_error) when the encoder drifted. */
int rl_router_golden_texts_json(const rl_router *r, char *out, size_t cap);
int rl_router_verify_encoder(const rl_router *r, const float *embs, size_t n, size_t dim,
                             char *out, size_t cap);
/* Binders made over r keep their own reference: they work after rl_router_free(r). */
void rl_router_free(rl_router *r);

/* Session binder. r NULL: every opening takes config's fallback_candidate (router_not_loaded).
 * config_json: SessionBinder's keyword arguments {"rate", "cap", "salt", "ladder", "ttl_s",
 * "max_sessions", "fallback_candidate"} (NULL or absent keys: defaults).
 * turn_json: {"session_id", "text", "category", "prompt_tokens", "turn_index"} and
 * optionally "now" (seconds; absent: seconds since rl_binder_new). The answer: the
 * ledger-v1 receipt, the canonical record of `replaylab-route bind`. */
rl_binder *rl_binder_new(const rl_router *r, const char *config_json);
int rl_binder_bind_json(rl_binder *b, const char *turn_json, char *out, size_t cap);
/* 1: the session's next turn escalates; 0: it cannot (unknown session, strongest already) */
int rl_binder_report_failure(rl_binder *b, const char *session_id);
/* the counts: the `stats` record of the replay format */
int rl_binder_stats_json(rl_binder *b, char *out, size_t cap);
void rl_binder_free(rl_binder *b);

#ifdef __cplusplus
}
#endif
#endif /* REPLAYLAB_H */
