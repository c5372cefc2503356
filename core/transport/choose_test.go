package transport

import (
	"context"
	"errors"
	"github.com/tensorplay/tensorplay-rpc/core/internal/testctx"
	"strings"
	"testing"
)

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

// refusing is a transport whose dials fail, like a shared-memory listener that will not take
// this worker; reach says which addresses it claims to reach.
type refusing struct {
	Transport
	reach bool
}

func (r refusing) Reaches(string) bool { return r.reach }
func (refusing) Dial(context.Context, string) (Stream, error) {
	return nil, errors.New("refused")
}

func TestChooserFallsBackAndSkipsWhatItCannotReach(t *testing.T) {
	for _, reach := range []bool{true, false} {
		net := NewInmemNetwork()
		listener := NewChooser(Choice{"first", net.Transport()}, Choice{"second", net.Transport()})
		addr, err := listener.Listen("", func(Stream) {})
		if err != nil {
			t.Fatal(err)
		}
		dialer := NewChooser(Choice{"first", refusing{reach: reach}}, Choice{"second", net.Transport()})
		s, err := dialer.Dial(testctx.For(t), addr)
		if err != nil {
			t.Fatalf("reach=%v: %v, want a stream over the second transport", reach, err)
		}
		s.Close()
	}
	if _, err := NewChooser(Choice{"first", refusing{reach: false}}).Dial(testctx.For(t), "first=x"); err == nil || !strings.Contains(err.Error(), "no transport") {
		t.Fatalf("a dial nothing reaches: %v, want one saying no transport reaches it", err)
	}
}
