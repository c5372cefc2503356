package core

import (
	"strings"
	"testing"
)

func TestTransportNames(t *testing.T) {
	cases := []struct {
		env     string
		wantErr string
	}{
		{"grpc", ""},
		{"shm, grpc", ""},
		{"grpc,shm", ""},
		{"tcp", ""},
		{"shm,tcp,grpc", ""},
		{"uv", `unknown transport "uv"`},
		{"grpc,grpc", `named twice`},
		{" , ", "no transport named"},
	}
	for _, c := range cases {
		tr, err := newTransport(Config{}, func(string) string { return c.env })
		if c.wantErr == "" {
			if err != nil {
				t.Errorf("%s=%q: %v", TransportsEnv, c.env, err)
				continue
			}
			tr.Close()
			continue
		}
		if err == nil || !strings.Contains(err.Error(), c.wantErr) || !strings.Contains(err.Error(), TransportsEnv) {
			t.Errorf("%s=%q: err %v, want one naming the variable and saying %q", TransportsEnv, c.env, err, c.wantErr)
		}
	}
}
