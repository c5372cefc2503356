package rendezvous

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"
)

// TestAnUnreachableStoreIsExplained: a join that reaches no store says whether nothing listens
// at the address or something that is not a store of ours does (torch's TCPStore, when the
// ranks of a world did not all meet the same way).
func TestAnUnreachableStoreIsExplained(t *testing.T) {
	tests := []struct {
		name   string
		listen func(t *testing.T) string // returns the store address to dial
		want   string
	}{
		{name: "nothing listens", listen: func(t *testing.T) string {
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			addr := l.Addr().String()
			l.Close()
			return addr
		}, want: "is rank 0 running"},
		{name: "a server that is not a store", listen: func(t *testing.T) string {
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { l.Close() })
			go func() {
				for {
					conn, err := l.Accept()
					if err != nil {
						return
					}
					conn.Close() // as a server speaking another protocol hangs up on a gRPC client
				}
			}()
			return l.Addr().String()
		}, want: "something listens there but does not answer as this package's store"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			store, err := DialStore(tt.listen(t), "", nil)
			if err != nil {
				t.Fatal(err)
			}
			defer store.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			_, err = store.Gather(ctx, GatherRequest{Round: JoinRound, Rank: 1, Size: 2, Who: `"w1"`, Value: []byte{1}, WaitMs: 1500})
			if err == nil || !strings.Contains(err.Error(), "could not reach the rendezvous store") || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want one saying %q", err, tt.want)
			}
		})
	}
}
