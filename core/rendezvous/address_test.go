package rendezvous

import (
	"strings"
	"testing"
)

func TestStoreAddress(t *testing.T) {
	env := map[string]string{"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
	tests := []struct {
		init, want, wantErr string
		env                 map[string]string
	}{
		{init: "env://", env: env, want: "127.0.0.1:29500"},
		{init: "env://", env: map[string]string{"MASTER_PORT": "1"}, wantErr: "MASTER_ADDR"},
		{init: "env://", env: map[string]string{"MASTER_ADDR": "h"}, wantErr: "MASTER_PORT"},
		{init: "env://", env: map[string]string{"MASTER_ADDR": "h", "MASTER_PORT": "x"}, wantErr: "must be a number"},
		{init: "tcp://localhost:1234", want: "localhost:1234"},
		{init: "tcp://localhost", wantErr: "must be host:port"},
		{init: "udp://x:1", wantErr: "not supported"},
	}
	for _, tt := range tests {
		t.Run(tt.init+tt.wantErr, func(t *testing.T) {
			got, err := StoreAddress(tt.init, func(k string) string { return tt.env[k] })
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("got %q, %v; want %q", got, err, tt.want)
			}
		})
	}
}
