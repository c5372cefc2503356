package core

import (
	"bytes"
	"log/slog"
	"strings"
	"sync"
	"testing"
)

// TestWarnsOnceWithoutATokenOffLoopback: listening beyond loopback without a token is allowed,
// as in torch, but said once, plainly; with a token, or on loopback, nothing is said.
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
			warnOpenOnce = sync.Once{}
			var logged bytes.Buffer
			previous := slog.Default()
			slog.SetDefault(slog.New(slog.NewTextHandler(&logged, nil)))
			defer slog.SetDefault(previous)
			for i := 0; i < 2; i++ {
				tr, err := NewGRPCTransport(tt.token, nil)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := tr.Listen(tt.host, func(Stream) {}); err != nil {
					t.Fatal(err)
				}
				tr.Close()
			}
			if n := strings.Count(logged.String(), "without a token"); n != tt.warnings {
				t.Fatalf("warned %d times, want %d:\n%s", n, tt.warnings, logged.String())
			}
			if tt.warnings > 0 && !strings.Contains(logged.String(), "TENSORPLAY_RPC_TOKEN") {
				t.Fatalf("the warning does not say what to do:\n%s", logged.String())
			}
		})
	}
}
