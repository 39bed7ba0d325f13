// Command latency times the Go host's calls through the C ABI (make bench,
// bench/bench_native.py): one route per line of QUERIES (JSONL {"text", "category",
// "prompt_tokens"}), then one hint per line of REQUESTS, each call timed alone.
//
//	go run ./cmd/latency ROUTER_DIR QUERIES.jsonl DEMAND_DIR REQUESTS.jsonl N
//
// Prints {"route": {"p50_us", "p99_us", "calls"}, "hint": {...}} on one line.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strconv"
	"time"

	replaylab "github.com/replaylab/replaylab/scorers/go"
)

func lines(path string) []string {
	f, err := os.Open(path)
	if err != nil {
		panic(err)
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		if len(sc.Bytes()) > 0 {
			out = append(out, sc.Text())
		}
	}
	return out
}

func summary(us []float64) map[string]float64 {
	sort.Float64s(us)
	at := func(q float64) float64 { return us[int(q*float64(len(us)-1)+0.5)] }
	return map[string]float64{"p50_us": at(0.50), "p99_us": at(0.99), "calls": float64(len(us))}
}

func timed(n int, inputs []string, call func(string) (string, error)) []float64 {
	for i := 0; i < 20; i++ { // warm-up
		if _, err := call(inputs[i%len(inputs)]); err != nil {
			panic(err)
		}
	}
	us := make([]float64, n)
	for i := 0; i < n; i++ {
		t := time.Now()
		if _, err := call(inputs[i%len(inputs)]); err != nil {
			panic(err)
		}
		us[i] = float64(time.Since(t).Nanoseconds()) / 1e3
	}
	return us
}

func main() {
	if len(os.Args) != 6 {
		fmt.Fprintln(os.Stderr, "usage: latency ROUTER_DIR QUERIES.jsonl DEMAND_DIR REQUESTS.jsonl N")
		os.Exit(2)
	}
	n, _ := strconv.Atoi(os.Args[5])
	r, err := replaylab.LoadRouter(os.Args[1], 0)
	if err != nil {
		panic(err)
	}
	d, err := replaylab.LoadDemand(os.Args[3], 0)
	if err != nil {
		panic(err)
	}
	now := time.Now().UnixMilli()
	out := map[string]interface{}{
		"route": summary(timed(n, lines(os.Args[2]), r.RouteJSON)),
		"hint":  summary(timed(n, lines(os.Args[4]), func(q string) (string, error) { return d.HintJSON(q, now) })),
	}
	b, _ := json.Marshal(out)
	fmt.Println(string(b))
}
