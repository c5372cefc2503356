package core

import (
	"strings"
	"testing"
	"time"
)

func TestResolvePeerTimeout(t *testing.T) {
	tests := []struct {
		name       string
		configured time.Duration
		env        string
		want       time.Duration
		wantErr    string
	}{
		{name: "default", want: DefaultPeerTimeout},
		{name: "configured", configured: 12 * time.Second, env: "99", want: 12 * time.Second},
		{name: "environment", env: "12.5", want: 12500 * time.Millisecond},
		{name: "too short", env: "3", wantErr: "shorter than 11s"},
		{name: "configured too short", configured: time.Second, wantErr: "shorter than 11s"},
		{name: "not a number", env: "soon", wantErr: `TENSORPLAY_RPC_PEER_TIMEOUT="soon"`},
		{name: "negative", env: "-4", wantErr: "positive number of seconds"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := resolvePeerTimeout(tt.configured, func(string) string { return tt.env })
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want it to say %q", err, tt.wantErr)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("got %v, %v; want %v", got, err, tt.want)
			}
		})
	}
}
