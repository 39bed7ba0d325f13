// Package replaylab hosts replaylab's artifacts in a Go process through the C ABI of
// the Rust scorer (libreplaylab_scorer.a, scorers/rust; docs/specs/c-abi.md): demand
// hints, routing (from text on the static tier, from the host's own embedding on either
// tier), and the session binder. Build the library first:
//
//	cd scorers/rust && cargo build --release
//
// The answers are the JSON lines of `replaylab-route` (hint, decision, ledger-v1 receipt).
// Handles are safe to share across goroutines (a Binder locks inside the library).
package replaylab

/*
#cgo CFLAGS: -I${SRCDIR}/../rust/include
#cgo LDFLAGS: ${SRCDIR}/../rust/target/release/libreplaylab_scorer.a -lpthread -ldl -lm
#include <stdlib.h>
#include "replaylab.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"math"
	"runtime"
	"unsafe"
)

// Error is a refusal of the library: its return code and rl_last_error.
type Error struct {
	Code    int
	Message string
}

func (e *Error) Error() string { return fmt.Sprintf("replaylab: code %d: %s", e.Code, e.Message) }

// ErrDrift is the code of a host encoder that misses the artifact's golden embeddings.
const ErrDrift = int(C.RL_ERR_DRIFT)

func lastError(code int) error {
	msg := "(no message)"
	if p := C.rl_last_error(); p != nil {
		msg = C.GoString(p)
	}
	return &Error{Code: code, Message: msg}
}

// answer calls f with a buffer, growing it once to the size the library asks for. The
// library's error is read on the same OS thread as the call.
func answer(f func(out *C.char, cap C.size_t) C.int) (string, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	buf := make([]byte, 4096)
	for i := 0; i < 2; i++ {
		rc := int(f((*C.char)(unsafe.Pointer(&buf[0])), C.size_t(len(buf))))
		if rc == 0 {
			return C.GoString((*C.char)(unsafe.Pointer(&buf[0]))), nil
		}
		if rc < 0 {
			return "", lastError(rc)
		}
		buf = make([]byte, rc)
	}
	return "", errors.New("replaylab: the answer outgrew the size the library asked for")
}

func cstr(s string) *C.char { return C.CString(s) }

// Demand is a loaded, verified demand artifact.
type Demand struct{ h *C.rl_demand }

// LoadDemand verifies and loads dir (validity at nowS seconds; 0: now; golden vectors checked).
func LoadDemand(dir string, nowS float64) (*Demand, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	d := cstr(dir)
	defer C.free(unsafe.Pointer(d))
	h := C.rl_demand_load(d, C.double(nowS))
	if h == nil {
		return nil, lastError(int(C.RL_ERR_STATE))
	}
	return &Demand{h}, nil
}

// HintJSON answers the request (DemandPredictor.predict's dict as JSON) stamped at nowMs
// when it has no timestamp.
func (d *Demand) HintJSON(request string, nowMs int64) (string, error) {
	r := cstr(request)
	defer C.free(unsafe.Pointer(r))
	return answer(func(out *C.char, cap C.size_t) C.int {
		return C.rl_demand_hint_json_at(d.h, r, C.int64_t(nowMs), out, cap)
	})
}

// Close frees the handle.
func (d *Demand) Close() { C.rl_demand_free(d.h); d.h = nil }

// Router is a loaded, verified router artifact.
type Router struct{ h *C.rl_router }

// LoadRouter verifies and loads dir; a MiniLM-tier artifact routes embeddings only.
func LoadRouter(dir string, nowS float64) (*Router, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	d := cstr(dir)
	defer C.free(unsafe.Pointer(d))
	h := C.rl_router_load(d, C.double(nowS))
	if h == nil {
		return nil, lastError(int(C.RL_ERR_STATE))
	}
	return &Router{h}, nil
}

// RouteJSON routes {"text", "category", "prompt_tokens"}.
func (r *Router) RouteJSON(request string) (string, error) {
	q := cstr(request)
	defer C.free(unsafe.Pointer(q))
	return answer(func(out *C.char, cap C.size_t) C.int { return C.rl_router_route_json(r.h, q, out, cap) })
}

// RouteEmbedding routes on the host's embedding; category "" is none, promptTokens NaN unknown.
func (r *Router) RouteEmbedding(emb []float32, category string, promptTokens float64) (string, error) {
	if len(emb) == 0 {
		return "", &Error{Code: int(C.RL_ERR_NULL), Message: "empty embedding"}
	}
	var cat *C.char
	if category != "" {
		cat = cstr(category)
		defer C.free(unsafe.Pointer(cat))
	}
	// a cgo call may pass a pointer into Go memory that holds no Go pointers
	p := (*C.float)(unsafe.Pointer(&emb[0]))
	return answer(func(out *C.char, cap C.size_t) C.int {
		return C.rl_router_route_embedding(r.h, p, C.size_t(len(emb)), cat, C.double(promptTokens), out, cap)
	})
}

// GoldenTextsJSON lists the texts whose embeddings prove a host's encoder.
func (r *Router) GoldenTextsJSON() (string, error) {
	return answer(func(out *C.char, cap C.size_t) C.int { return C.rl_router_golden_texts_json(r.h, out, cap) })
}

// VerifyEncoder checks the host's embeddings of the golden texts (one row each); an
// *Error with Code ErrDrift when they miss.
func (r *Router) VerifyEncoder(rows [][]float32) (string, error) {
	if len(rows) == 0 || len(rows[0]) == 0 {
		return "", &Error{Code: int(C.RL_ERR_NULL), Message: "no embeddings"}
	}
	dim := len(rows[0])
	flat := make([]float32, 0, len(rows)*dim)
	for _, row := range rows {
		if len(row) != dim {
			return "", &Error{Code: int(C.RL_ERR_INPUT), Message: "rows of different lengths"}
		}
		flat = append(flat, row...)
	}
	p := (*C.float)(unsafe.Pointer(&flat[0]))
	return answer(func(out *C.char, cap C.size_t) C.int {
		return C.rl_router_verify_encoder(r.h, p, C.size_t(len(rows)), C.size_t(dim), out, cap)
	})
}

// Close frees the handle (binders over it keep working).
func (r *Router) Close() { C.rl_router_free(r.h); r.h = nil }

// Binder is a session binder (safe for concurrent use).
type Binder struct{ h *C.rl_binder }

// NewBinder makes a binder over r (nil: config must name fallback_candidate);
// config is SessionBinder's keyword arguments as JSON ("" : defaults).
func NewBinder(r *Router, config string) (*Binder, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var cfg *C.char
	if config != "" {
		cfg = cstr(config)
		defer C.free(unsafe.Pointer(cfg))
	}
	var rh *C.rl_router
	if r != nil {
		rh = r.h
	}
	h := C.rl_binder_new(rh, cfg)
	if h == nil {
		return nil, lastError(int(C.RL_ERR_STATE))
	}
	return &Binder{h}, nil
}

// BindJSON serves one turn {"session_id", "text", "category", "prompt_tokens",
// "turn_index", "now"?}: its ledger-v1 receipt.
func (b *Binder) BindJSON(turn string) (string, error) {
	t := cstr(turn)
	defer C.free(unsafe.Pointer(t))
	return answer(func(out *C.char, cap C.size_t) C.int { return C.rl_binder_bind_json(b.h, t, out, cap) })
}

// ReportFailure says a turn of sessionID failed: true when its next turn escalates.
func (b *Binder) ReportFailure(sessionID string) (bool, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	s := cstr(sessionID)
	defer C.free(unsafe.Pointer(s))
	rc := int(C.rl_binder_report_failure(b.h, s))
	if rc < 0 {
		return false, lastError(rc)
	}
	return rc == 1, nil
}

// StatsJSON is the binder's counts (the replay format's stats record).
func (b *Binder) StatsJSON() (string, error) {
	return answer(func(out *C.char, cap C.size_t) C.int { return C.rl_binder_stats_json(b.h, out, cap) })
}

// Close frees the binder.
func (b *Binder) Close() { C.rl_binder_free(b.h); b.h = nil }

// NaN is the "unknown" prompt token count of RouteEmbedding.
var NaN = math.NaN()
