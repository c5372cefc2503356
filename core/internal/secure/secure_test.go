package secure

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// TestRefusalsAreLoggedOncePerHostPerInterval: a flood of refused connections makes one log
// line per host per interval, counting them, instead of one line each.
func TestRefusalsAreLoggedOncePerHostPerInterval(t *testing.T) {
	var out bytes.Buffer
	old := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&out, nil)))
	defer slog.SetDefault(old)
	l := newRefusalLog(time.Hour)
	for i := 0; i < 100; i++ {
		l.note("10.9.8.7:" + string(rune('0'+i%10)) + "1")
	}
	l.note("10.9.8.6:5")
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 2 || !strings.Contains(lines[0], "from=10.9.8.7") || !strings.Contains(lines[1], "from=10.9.8.6") {
		t.Fatalf("want one line per host, got:\n%s", out.String())
	}
	// Once the interval has passed, the next refusal reports how many were left unlogged.
	l.hosts["10.9.8.7"].logged = time.Now().Add(-2 * time.Hour)
	l.note("10.9.8.7:1")
	if !strings.Contains(out.String(), "count=100") {
		t.Fatalf("the second line should count the 99 unlogged refusals and this one:\n%s", out.String())
	}
}

// TestWarnsOnceWithoutATokenOffLoopback: listening beyond loopback without a token is allowed,
// as in torch, but said once per kind of server, plainly; with a token, or on loopback,
// nothing is said.
func TestWarnsOnceWithoutATokenOffLoopback(t *testing.T) {
	tests := []struct {
		name, host, token string
		warnings          int
	}{
		{name: "all interfaces, no token", host: "0.0.0.0", warnings: 1},
		{name: "all interfaces, token", host: "0.0.0.0", token: "s3cret", warnings: 0},
		{name: "loopback, no token", host: "127.0.0.1", warnings: 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ForgetWarnings()
			var logged bytes.Buffer
			previous := slog.Default()
			slog.SetDefault(slog.New(slog.NewTextHandler(&logged, nil)))
			defer slog.SetDefault(previous)
			sec, err := New(tt.token, nil)
			if err != nil {
				t.Fatal(err)
			}
			for _, what := range []string{"worker", "worker", "rendezvous store"} {
				sec.WarnIfOpen(what, tt.host, "do harm")
			}
			// Once for the workers' port and once for the store's.
			if n := strings.Count(logged.String(), "without a token"); n != 2*tt.warnings {
				t.Fatalf("warned %d times, want %d:\n%s", n, 2*tt.warnings, logged.String())
			}
			if tt.warnings > 0 && (!strings.Contains(logged.String(), "TENSORPLAY_RPC_TOKEN") || !strings.Contains(logged.String(), "rendezvous store")) {
				t.Fatalf("the warning does not say which port, or what to do:\n%s", logged.String())
			}
		})
	}
}

// TestKeepaliveSpansThePeerTimeout: a silent peer is pinged after `every` and must answer
// within `answerWithin`; together they are the peer timeout, and gRPC-Go's client pings at
// most every 10 s whatever it is told.
func TestKeepaliveSpansThePeerTimeout(t *testing.T) {
	tests := []struct {
		peerTimeout, every, answerWithin time.Duration
	}{
		{0, 10 * time.Second, 20 * time.Second}, // the default, 30 s
		{12 * time.Second, 10 * time.Second, 2 * time.Second},
		{90 * time.Second, 30 * time.Second, 60 * time.Second},
	}
	for _, tt := range tests {
		every, answerWithin := World{}.WithPeerTimeout(tt.peerTimeout).keepalive()
		if every != tt.every || answerWithin != tt.answerWithin {
			t.Errorf("peer timeout %v: ping after %v, answer within %v; want %v and %v", tt.peerTimeout, every, answerWithin, tt.every, tt.answerWithin)
		}
	}
}
