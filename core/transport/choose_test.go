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
