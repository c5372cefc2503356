package promexport_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tensorplay/tensorplay-rpc/core"
	"github.com/tensorplay/tensorplay-rpc/core/coretest"
	"github.com/tensorplay/tensorplay-rpc/core/promexport"
)

func TestScrapeShowsTrafficByPeer(t *testing.T) {
	handlers := map[string]core.Handler{
		"echo": core.HandlerFunc(func(_ context.Context, req core.Message) (core.Message, error) { return req, nil }),
		"fail": core.HandlerFunc(func(context.Context, core.Message) (core.Message, error) { return core.Message{}, errors.New("no") }),
	}
	c := coretest.New(t, 2, coretest.Options{Handlers: handlers})
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	a := c.Agents[0]
	for range 3 {
		if _, err := a.Call(ctx, "w1", "echo", core.Message{Payload: make([]byte, 100)}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := a.Call(ctx, "w1", "fail", core.Message{Payload: make([]byte, 10)}); err == nil {
		t.Fatal("fail did not fail")
	}
	srv, err := promexport.Serve("127.0.0.1:0", a)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close(ctx)
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+srv.Addr()+"/metrics", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("scrape: %d %v", resp.StatusCode, err)
	}
	text := string(body)
	for _, want := range []string{
		`tensorplay_rpc_calls_sent_total{peer="w1",worker="w0"} 4`,
		`tensorplay_rpc_sent_bytes_total{peer="w1",worker="w0"} 310`,
		`tensorplay_rpc_received_bytes_total{peer="w1",worker="w0"} 300`,
		`tensorplay_rpc_call_errors_total{kind="remote",peer="w1",worker="w0"} 1`,
		`tensorplay_rpc_call_errors_total{kind="timeout",peer="w1",worker="w0"} 0`,
		`tensorplay_rpc_calls_in_flight{peer="w1",worker="w0"} 0`,
		`tensorplay_rpc_call_duration_seconds_count{peer="w1",worker="w0"} 4`,
		`tensorplay_rpc_call_duration_seconds_bucket{peer="w1",worker="w0",le="+Inf"} 4`,
		`tensorplay_rpc_call_duration_seconds_bucket{peer="w1",worker="w0",le="1.048576"} 4`, // all under a second
		`tensorplay_rpc_call_duration_seconds_bucket{peer="w1",worker="w0",le="1e-06"} 0`,
		`tensorplay_rpc_calls_outstanding{worker="w0"} 0`,
		"go_goroutines ",
		"process_resident_memory_bytes ",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("scrape lacks %q", want)
		}
	}
	if t.Failed() {
		t.Logf("scraped:\n%s", text)
	}
}

func TestPortFor(t *testing.T) {
	tests := []struct {
		base      string
		localRank int
		want, err string
	}{
		{base: "9100", localRank: 0, want: "9100"},
		{base: "9100", localRank: 3, want: "9103"},
		{base: "0", localRank: 3, want: "0"},
		{base: "65535", localRank: 1, err: "must be a number from 0 to 65534"},
		{base: "x", localRank: 0, err: `metrics port "x"`},
		{base: "-1", localRank: 0, err: "must be a number"},
	}
	for _, tt := range tests {
		got, err := promexport.PortFor(tt.base, tt.localRank)
		if tt.err != "" {
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("PortFor(%q, %d) = %q, %v; want error %q", tt.base, tt.localRank, got, err, tt.err)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("PortFor(%q, %d) = %q, %v; want %q", tt.base, tt.localRank, got, err, tt.want)
		}
	}
}
