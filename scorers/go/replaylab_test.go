package replaylab

// go test: the Go host loads the committed fixture artifacts (scorers/rust/tests/fixtures)
// through the C ABI and agrees with the Python runtime: the demand and router golden
// vectors within golden.json's tolerances (token ids and candidates exactly), routing on
// the host's embedding of a MiniLM-tier fixture's golden triples (skipped, saying so, when
// none is committed), and the golden binder sessions (scorers/rust/tests/sessions, the
// Python runtime's records) replayed byte for byte, from one goroutine and again with the
// sessions spread over 8 goroutines (each session's own records in order).

import (
	"bufio"
	"bytes"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"
)

const fixtures = "../rust/tests/fixtures"
const sessions = "../rust/tests/sessions"

type golden struct {
	Tolerances map[string]float64 `json:"tolerances"`
	Cases      []struct {
		Input    json.RawMessage            `json:"input"`
		Expected map[string]json.RawMessage `json:"expected"`
	} `json:"cases"`
}

func readGolden(t *testing.T, dir string) golden {
	var g golden
	data, err := os.ReadFile(filepath.Join(dir, "golden.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &g); err != nil {
		t.Fatal(err)
	}
	return g
}

func createdMs(t *testing.T, dir string) int64 {
	var m struct {
		CreatedAt string `json:"created_at"`
	}
	data, _ := os.ReadFile(filepath.Join(dir, "manifest.json"))
	if err := json.Unmarshal(data, &m); err != nil {
		t.Fatal(err)
	}
	ts, err := time.Parse(time.RFC3339, m.CreatedAt)
	if err != nil {
		t.Fatal(err)
	}
	return ts.UnixMilli()
}

func TestDemandGoldenVectors(t *testing.T) {
	dir := filepath.Join(fixtures, "demand")
	d, err := LoadDemand(dir, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	g := readGolden(t, dir)
	now := createdMs(t, dir)
	for i, c := range g.Cases {
		line, err := d.HintJSON(string(c.Input), now)
		if err != nil {
			t.Fatal(i, err)
		}
		var got, want map[string]interface{}
		_ = json.Unmarshal([]byte(line), &got)
		raw, _ := json.Marshal(c.Expected)
		_ = json.Unmarshal(raw, &want)
		for _, k := range []string{"hint_p50", "hint_p90", "hint_lo", "hint_hi"} {
			a, b := got[k].(float64), want[k].(float64)
			if math.Abs(a-b) > g.Tolerances["hint_abs"]+g.Tolerances["hint_rel"]*math.Max(math.Abs(b), 1) {
				t.Errorf("case %d %s: %v, golden %v", i, k, a, b)
			}
		}
		for _, k := range []string{"hint_fallback", "fallback_reason", "cell", "correction"} {
			if got[k] != want[k] {
				t.Errorf("case %d %s: %v, golden %v", i, k, got[k], want[k])
			}
		}
	}
	if _, err := d.HintJSON("{\"prompt_tokens\":", now); err == nil || err.(*Error).Code != -2 {
		t.Errorf("JSON cut short: %v", err)
	}
}

type decision struct {
	Candidate   string    `json:"candidate"`
	SuccessProb []float64 `json:"success_prob"`
	Margin      *float64  `json:"margin"`
	TokenIDs    []int     `json:"token_ids"`
	Embedding   []float32 `json:"embedding"`
}

func TestRouterGoldenVectors(t *testing.T) {
	dir := filepath.Join(fixtures, "router")
	r, err := LoadRouter(dir, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	g := readGolden(t, dir)
	tol := g.Tolerances["static_prob_abs"]
	for i, c := range g.Cases {
		line, err := r.RouteJSON(string(c.Input))
		if err != nil {
			t.Fatal(i, err)
		}
		var got, want decision
		_ = json.Unmarshal([]byte(line), &got)
		_ = json.Unmarshal(c.Expected["static"], &want)
		if got.Candidate != want.Candidate || !equalInts(got.TokenIDs, want.TokenIDs) {
			t.Errorf("case %d: %s %v, golden %s %v", i, got.Candidate, got.TokenIDs, want.Candidate, want.TokenIDs)
		}
		for j := range want.SuccessProb {
			if math.Abs(got.SuccessProb[j]-want.SuccessProb[j]) > tol {
				t.Errorf("case %d prob %d: %v, golden %v", i, j, got.SuccessProb[j], want.SuccessProb[j])
			}
		}
	}
	// the same answers from 8 goroutines sharing the handle
	first, _ := r.RouteJSON(string(g.Cases[0].Input))
	var wg sync.WaitGroup
	differ := make(chan string, 8)
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := 0; k < 200; k++ {
				if got, err := r.RouteJSON(string(g.Cases[0].Input)); err != nil || got != first {
					differ <- got
					return
				}
			}
		}()
	}
	wg.Wait()
	close(differ)
	for d := range differ {
		t.Errorf("a goroutine got %q", d)
	}
}

// TestRouteByEmbedding routes the golden triples of every MiniLM-tier fixture on their
// stored embeddings (as a host whose encoder matches) and proves that encoder.
func TestRouteByEmbedding(t *testing.T) {
	dirs, _ := filepath.Glob(filepath.Join(fixtures, "*", "golden.json"))
	checked := 0
	for _, path := range dirs {
		dir := filepath.Dir(path)
		g := readGolden(t, dir)
		if len(g.Cases) == 0 || g.Cases[0].Expected["fp32"] == nil {
			continue
		}
		var probe decision
		_ = json.Unmarshal(g.Cases[0].Expected["fp32"], &probe)
		if len(probe.Embedding) == 0 {
			continue
		}
		r, err := LoadRouter(dir, 0)
		if err != nil {
			t.Fatal(dir, err)
		}
		tol := g.Tolerances["fp32_prob_abs"]
		var conf struct {
			PromptTokens struct {
				CharsPerToken float64 `json:"chars_per_token"`
			} `json:"prompt_tokens"`
		}
		raw, _ := os.ReadFile(filepath.Join(dir, "router.json"))
		_ = json.Unmarshal(raw, &conf)
		cpt := conf.PromptTokens.CharsPerToken
		var rows [][]float32
		for i, c := range g.Cases {
			var in struct {
				Text         string   `json:"text"`
				Category     *string  `json:"category"`
				PromptTokens *float64 `json:"prompt_tokens"`
			}
			_ = json.Unmarshal(c.Input, &in)
			var want decision
			_ = json.Unmarshal(c.Expected["fp32"], &want)
			rows = append(rows, want.Embedding)
			cat, tokens := "", NaN
			if in.Category != nil {
				cat = *in.Category
			}
			if in.PromptTokens != nil {
				tokens = *in.PromptTokens
			} else { // what the golden decision used: ceil(codepoints / chars_per_token)
				tokens = math.Ceil(float64(utf8.RuneCountInString(in.Text)) / cpt)
			}
			line, err := r.RouteEmbedding(want.Embedding, cat, tokens)
			if err != nil {
				t.Fatal(i, err)
			}
			var got decision
			_ = json.Unmarshal([]byte(line), &got)
			if got.Candidate != want.Candidate {
				t.Errorf("%s case %d: %s, golden %s", dir, i, got.Candidate, want.Candidate)
			}
			for j := range want.SuccessProb {
				if math.Abs(got.SuccessProb[j]-want.SuccessProb[j]) > tol {
					t.Errorf("%s case %d prob %d: %v, golden %v", dir, i, j, got.SuccessProb[j], want.SuccessProb[j])
				}
			}
		}
		if _, err := r.VerifyEncoder(rows); err != nil {
			t.Errorf("%s: the stored embeddings do not verify: %v", dir, err)
		}
		for _, row := range rows { // an encoder that drifted: every embedding reversed
			for i, j := 0, len(row)-1; i < j; i, j = i+1, j-1 {
				row[i], row[j] = row[j], row[i]
			}
		}
		if _, err := r.VerifyEncoder(rows); err == nil || err.(*Error).Code != ErrDrift {
			t.Errorf("%s: a drifted encoder was not refused: %v", dir, err)
		}
		if _, err := r.RouteJSON(`{"text": "hello"}`); err == nil || err.(*Error).Code != -5 {
			t.Errorf("%s: text routed on a MiniLM-tier router: %v", dir, err)
		}
		if _, err := r.RouteEmbedding(rows[0][:len(rows[0])-1], "", NaN); err == nil {
			t.Errorf("%s: an embedding of the wrong dimension was routed", dir)
		}
		r.Close()
		checked++
	}
	if checked == 0 {
		t.Skip("no MiniLM-tier fixture with golden triples under " + fixtures + ": routing by embedding not checked")
	}
}

func readLines(t *testing.T, path string) [][]byte {
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out [][]byte
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		out = append(out, append([]byte(nil), sc.Bytes()...))
	}
	return out
}

type event struct {
	Op        string   `json:"op"`
	SessionID string   `json:"session_id"`
	Now       *float64 `json:"now"`
}

// replay runs the events through b as the replay format does (the clock: each event's
// now, else the last); one record per event.
func replay(t *testing.T, b *Binder, lines [][]byte) []string {
	var out []string
	for i, line := range lines {
		var e event
		if err := json.Unmarshal(line, &e); err != nil {
			t.Fatal(i, err)
		}
		switch e.Op {
		case "bind":
			rec, err := b.BindJSON(string(line))
			if err != nil {
				t.Fatal(i, err)
			}
			out = append(out, rec)
		case "fail":
			ok, err := b.ReportFailure(e.SessionID)
			if err != nil {
				t.Fatal(i, err)
			}
			sid, _ := json.Marshal(e.SessionID)
			out = append(out, `{"escalated":`+map[bool]string{true: "true", false: "false"}[ok]+`,"op":"fail","session_id":`+string(sid)+`}`)
		case "stats":
			rec, err := b.StatsJSON()
			if err != nil {
				t.Fatal(i, err)
			}
			out = append(out, rec)
		}
	}
	return out
}

func TestGoldenSessionsByteForByte(t *testing.T) {
	r, err := LoadRouter(filepath.Join(fixtures, "router"), 0)
	if err != nil {
		t.Fatal(err)
	}
	config, _ := os.ReadFile(filepath.Join(sessions, "config.json"))
	b, err := NewBinder(r, strings.TrimSpace(string(config)))
	if err != nil {
		t.Fatal(err)
	}
	r.Close() // the binder keeps its own reference
	defer b.Close()
	events := readLines(t, filepath.Join(sessions, "events.jsonl"))
	want := readLines(t, filepath.Join(sessions, "receipts.jsonl"))
	got := replay(t, b, events)
	if len(got) != len(want) {
		t.Fatalf("%d records, want %d", len(got), len(want))
	}
	for i := range want {
		if got[i] != string(want[i]) {
			t.Fatalf("record %d:\n go     %s\n python %s", i, got[i], want[i])
		}
	}
}

func TestBinderFromGoroutines(t *testing.T) {
	// sessions of the golden replay whose openings are not evicted (max_sessions is large
	// here), one goroutine per session group: each session's records equal a serial run's
	r, err := LoadRouter(filepath.Join(fixtures, "router"), 0)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	cfg := `{"rate":0.2,"cap":0.3,"salt":"abi","max_sessions":100000,"ttl_s":1e9}`
	var binds [][]byte
	for _, line := range readLines(t, filepath.Join(sessions, "events.jsonl")) {
		var e event
		_ = json.Unmarshal(line, &e)
		if e.Op == "bind" {
			binds = append(binds, line)
		}
	}
	serial, _ := NewBinder(r, cfg)
	defer serial.Close()
	want := map[string][]string{}
	for i, rec := range replay(t, serial, binds) {
		var e event
		_ = json.Unmarshal(binds[i], &e)
		want[e.SessionID] = append(want[e.SessionID], rec)
	}
	shared, _ := NewBinder(r, cfg)
	defer shared.Close()
	var mu sync.Mutex
	got := map[string][]string{}
	var wg sync.WaitGroup
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for _, line := range binds {
				var e event
				_ = json.Unmarshal(line, &e)
				if int(e.SessionID[len(e.SessionID)-1])%8 != w {
					continue
				}
				rec, err := shared.BindJSON(string(line))
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				got[e.SessionID] = append(got[e.SessionID], rec)
				mu.Unlock()
			}
		}(w)
	}
	wg.Wait()
	for sid, recs := range want {
		if strings.Join(got[sid], "\n") != strings.Join(recs, "\n") {
			t.Errorf("session %s differs from the serial run", sid)
		}
	}
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
