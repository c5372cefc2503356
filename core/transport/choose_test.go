package transport

import "testing"

func TestNetworkAddr(t *testing.T) {
	cases := []struct{ addr, want string }{
		{"127.0.0.1:4242", "127.0.0.1:4242"},
		{"shm=shm://boot.1/tensorplay-rpc/1/ab;grpc=10.0.0.2:80", "10.0.0.2:80"},
		{"grpc=[::1]:9;shm=shm://k/n", "[::1]:9"},
		{"shm=shm://k/n", "shm=shm://k/n"},
	}
	for _, c := range cases {
		if got := NetworkAddr(c.addr); got != c.want {
			t.Errorf("NetworkAddr(%q) = %q, want %q", c.addr, got, c.want)
		}
	}
}

func TestChoiceAddr(t *testing.T) {
	addr := "shm=shm://boot.1/tensorplay-rpc/1/ab;grpc=10.0.0.2:80"
	cases := []struct {
		name, want string
		ok         bool
	}{
		{"shm", "shm://boot.1/tensorplay-rpc/1/ab", true},
		{"grpc", "10.0.0.2:80", true},
		{"tcp", "", false},
	}
	for _, c := range cases {
		if got, ok := ChoiceAddr(addr, c.name); got != c.want || ok != c.ok {
			t.Errorf("ChoiceAddr(%q) = %q, %v; want %q, %v", c.name, got, ok, c.want, c.ok)
		}
	}
}
