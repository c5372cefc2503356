package core

import (
	"context"
	"crypto/subtle"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	grpcpeer "google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"
)

// tokenHeader carries a world's shared secret on every gRPC call and stream.
const tokenHeader = "tensorplay-token"

// security is what guards a world's connections, the store's and the workers' alike: its
// token and its TLS credentials.
type security struct {
	token          string
	server, client credentials.TransportCredentials // nil without TLS
	refusals       *refusalLog
}

func newSecurity(token string, files *TLSFiles) (security, error) {
	sec := security{token: token, refusals: newRefusalLog(time.Minute)}
	if files != nil {
		var err error
		if sec.server, sec.client, err = files.credentials(); err != nil {
			return security{}, err
		}
	}
	return sec, nil
}

// tokenCredentials attaches the world's token to every call.
type tokenCredentials string

func (t tokenCredentials) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{tokenHeader: string(t)}, nil
}

// RequireTransportSecurity is false: the token also guards plaintext worlds (see TLS for
// keeping it secret on the wire).
func (tokenCredentials) RequireTransportSecurity() bool { return false }

// tap refuses a stream that does not carry the token as soon as its headers arrive, before
// gRPC creates it or reads any of its messages.
func (sec security) tap(ctx context.Context, info *tap.Info) (context.Context, error) {
	if sec.token == "" {
		return ctx, nil
	}
	if got := info.Header.Get(tokenHeader); len(got) == 1 && subtle.ConstantTimeCompare([]byte(got[0]), []byte(sec.token)) == 1 {
		return ctx, nil
	}
	from := "an unknown address"
	if p, ok := grpcpeer.FromContext(ctx); ok {
		from = p.Addr.String()
	}
	sec.refusals.note(from)
	return ctx, status.Error(codes.Unauthenticated, "this world requires its token (TENSORPLAY_RPC_TOKEN)")
}

// refusalLog logs refused connections at most once per peer host per interval, with the
// number refused since the last line, so a flood of strangers cannot flood the log.
type refusalLog struct {
	every time.Duration

	mu    sync.Mutex
	hosts map[string]*refusals
}

type refusals struct {
	logged time.Time
	since  int // refused since the last line
}

// maxRefusalHosts bounds the hosts remembered; past it, the oldest are forgotten.
const maxRefusalHosts = 1024

func newRefusalLog(every time.Duration) *refusalLog {
	return &refusalLog{every: every, hosts: map[string]*refusals{}}
}

// note counts a refusal of a connection from addr and logs it if its host's turn has come.
func (l *refusalLog) note(addr string) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		host = addr
	}
	now := time.Now()
	l.mu.Lock()
	r := l.hosts[host]
	if r == nil {
		if len(l.hosts) >= maxRefusalHosts {
			l.forgetOldest()
		}
		r = &refusals{}
		l.hosts[host] = r
	}
	r.since++
	if !r.logged.IsZero() && now.Sub(r.logged) < l.every {
		l.mu.Unlock()
		return
	}
	count := r.since
	r.logged, r.since = now, 0
	l.mu.Unlock()
	slog.Warn("tensorplay-rpc: refused connections without the world's token", "from", host, "count", count, "next_report_in", fmt.Sprint(l.every))
}

// forgetOldest drops the host logged longest ago; l.mu is held.
func (l *refusalLog) forgetOldest() {
	var oldest string
	var at time.Time
	for h, r := range l.hosts {
		if oldest == "" || r.logged.Before(at) {
			oldest, at = h, r.logged
		}
	}
	delete(l.hosts, oldest)
}

// checkToken refuses a call whose metadata lacks the token. The tap refuses such streams
// first; this guards handlers registered without it.
func checkToken(ctx context.Context, token string) error {
	if token == "" {
		return nil
	}
	md, _ := metadata.FromIncomingContext(ctx)
	if got := md.Get(tokenHeader); len(got) == 1 && subtle.ConstantTimeCompare([]byte(got[0]), []byte(token)) == 1 {
		return nil
	}
	return status.Error(codes.Unauthenticated, "this world requires its token (TENSORPLAY_RPC_TOKEN)")
}
