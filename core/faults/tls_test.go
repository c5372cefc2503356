package faults

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/tensorplay/tensorplay-rpc/core"
	"github.com/tensorplay/tensorplay-rpc/core/coretest"
	"github.com/tensorplay/tensorplay-rpc/core/wire"
)

// testCA is a throwaway certificate authority writing PEM files into a test's directory.
type testCA struct {
	t      *testing.T
	dir    string
	name   string
	key    *ecdsa.PrivateKey
	cert   *x509.Certificate
	caFile string
	serial int64
}

func newTestCA(t *testing.T, dir, name string) *testCA {
	t.Helper()
	ca := &testCA{t: t, dir: dir, name: name, key: newKey(t), serial: 1}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name + " CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &ca.key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	ca.cert, _ = x509.ParseCertificate(der)
	ca.caFile = ca.write("ca.pem", "CERTIFICATE", der)
	return ca
}

func newKey(t *testing.T) *ecdsa.PrivateKey {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func (ca *testCA) write(file, kind string, der []byte) string {
	path := filepath.Join(ca.dir, fmt.Sprintf("%s-%d-%s", ca.name, ca.serial, file))
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600); err != nil {
		ca.t.Fatal(err)
	}
	return path
}

// issue signs a worker certificate with common name cn and DNS names dns.
func (ca *testCA) issue(cn string, dns ...string) core.TLSFiles {
	ca.serial++
	key := newKey(ca.t)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(ca.serial), Subject: pkix.Name{CommonName: cn}, DNSNames: dns,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		ca.t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		ca.t.Fatal(err)
	}
	return core.TLSFiles{
		CA:   ca.caFile,
		Cert: ca.write("cert.pem", "CERTIFICATE", der),
		Key:  ca.write("key.pem", "EC PRIVATE KEY", keyDER),
	}
}

// throwawayCA makes a CA and one certificate it signed, as PEM files in dir.
func throwawayCA(t *testing.T, dir, name string) core.TLSFiles {
	return newTestCA(t, dir, name).issue(name + " worker")
}

// TestTLSRefusesClientsWithoutAValidCertificate: a world under mutual TLS talks to itself, and
// refuses a client without TLS, with no certificate or with one from another CA, at the store
// and at workers, for that reason.
func TestTLSRefusesClientsWithoutAValidCertificate(t *testing.T) {
	world := throwawayCA(t, t.TempDir(), "world")
	// Another CA under the world CA's name: a TLS client shows its certificate only to a
	// server that accepts certificates of the certificate's issuer (by name), so one issued by
	// a CA of another name would not be shown at all, and be refused as missing.
	impostor := throwawayCA(t, t.TempDir(), "world")
	stranger := core.TLSFiles{CA: world.CA, Cert: impostor.Cert, Key: impostor.Key}
	var served atomic.Int64
	handlers := map[string]core.Handler{
		"count": core.HandlerFunc(func(_ context.Context, req core.Message) (core.Message, error) {
			served.Add(1)
			return req, nil
		}),
	}
	cfgs := coretest.Configs(t, 2, coretest.Options{GRPC: true, Handlers: handlers, TLS: &world})
	storeAddr := strings.TrimPrefix(cfgs[0].InitMethod, "tcp://")
	agents := coretest.Start(t, cfgs).Agents
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := agents[0].Call(ctx, "w1", "count", core.Message{}); err != nil {
		t.Fatalf("a call inside the world: %v", err)
	}
	for name, files := range map[string]*core.TLSFiles{"no TLS": nil, "another CA": &stranger} {
		tr, addr, err := coretest.NetworkTransport(agents[1], "", files)
		if err != nil {
			t.Fatal(err)
		}
		s, err := tr.Dial(ctx, addr)
		if err == nil {
			s.Send(wire.HelloFrame("w0", 0, 0))
			s.Send(&wire.Frame{Kind: wire.FrameRequest, ID: 1, Method: "count"})
			_, err = s.Recv()
		}
		if err == nil {
			t.Errorf("%s: a client without a valid certificate was served", name)
		}
		tr.Close()
	}
	if n := served.Load(); n != 1 {
		t.Errorf("handlers ran %d times, want only the world's own call", n)
	}

	// Why, as each port tells a client (gRPC reports the connection's end, whose cause races
	// with its own writes): it speaks only TLS, and its TLS wants a certificate of the world's CA.
	pair, err := tls.LoadX509KeyPair(stranger.Cert, stranger.Key)
	if err != nil {
		t.Fatal(err)
	}
	for port, addr := range map[string]string{"worker": coretest.NetworkAddr(agents[1]), "store": storeAddr} {
		if answer, err := plaintextHTTP2(addr); err != nil || len(answer) > 0 {
			t.Errorf("%s: a client without TLS got %q, %v; want the connection closed without a word", port, answer, err)
		}
		for _, tt := range []struct {
			name  string
			certs []tls.Certificate
			want  string
		}{
			{name: "no certificate", want: "remote error: tls: certificate required"},
			{name: "another CA", certs: []tls.Certificate{pair}, want: "remote error: tls: unknown certificate authority"},
		} {
			err := tlsRefusal(addr, &tls.Config{Certificates: tt.certs, InsecureSkipVerify: true, NextProtos: []string{"h2"}})
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("%s, a client with %s: err = %v, want %q", port, tt.name, err, tt.want)
			}
		}
	}

	intruder := cfgs[1]
	intruder.Name, intruder.TLS, intruder.InitTimeout = "intruder", &stranger, time.Second
	if _, err := core.Start(ctx, intruder); !errors.Is(err, core.ErrRendezvous) || !strings.Contains(err.Error(), "could not reach the rendezvous store") {
		t.Fatalf("err = %v, want the intruder kept from the rendezvous store", err)
	}
}

// plaintextHTTP2 opens a connection to addr as an HTTP/2 client without TLS would (its
// preface and settings) and returns what the server sent back before it hung up. A server
// that does not hang up within 10 s is an error.
func plaintextHTTP2(addr string) ([]byte, error) {
	conn, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	preface := "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
	settings := []byte{0, 0, 0, 4, 0, 0, 0, 0, 0} // an empty SETTINGS frame
	if _, err := conn.Write(append([]byte(preface), settings...)); err != nil {
		return nil, err
	}
	answer, err := io.ReadAll(conn)
	if errors.Is(err, syscall.ECONNRESET) {
		err = nil // hung up on bytes it had not read: closed all the same
	}
	return answer, err
}

// tlsRefusal completes a TLS handshake with addr under cfg and reads: it returns why the
// server ended the connection, or nil if it spoke to the client.
func tlsRefusal(addr string, cfg *tls.Config) error {
	d := &net.Dialer{Timeout: 10 * time.Second}
	conn, err := tls.DialWithDialer(d, "tcp", addr, cfg)
	if err != nil {
		return err
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	// Under TLS 1.3 the server checks the client's certificate after the client's side of the
	// handshake is done: its verdict comes as the first thing read.
	if _, err := conn.Read(make([]byte, 1)); err != nil {
		return err
	}
	return nil
}

// TestTLSIsVersionThreeAndNamesBindWorkers: a client offering only TLS 1.2 is refused; in a
// world whose certificates name workers, a peer with a valid certificate can speak only as a
// worker its certificate names.
func TestTLSIsVersionThreeAndNamesBindWorkers(t *testing.T) {
	ca := newTestCA(t, t.TempDir(), "world")
	shared := ca.issue("workers", "w0", "w1", "w2")
	cfgs := coretest.Configs(t, 3, coretest.Options{GRPC: true, Handlers: echo, TLS: &shared})
	w0Log := newLogRecorder()
	cfgs[0].Logger = w0Log.logger()
	agents := coretest.Start(t, cfgs).Agents
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	pair, err := tls.LoadX509KeyPair(shared.Cert, shared.Key)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := tls.Dial("tcp", coretest.NetworkAddr(agents[1]), &tls.Config{
		Certificates: []tls.Certificate{pair}, MaxVersion: tls.VersionTLS12, InsecureSkipVerify: true,
	})
	if err == nil {
		err = conn.Handshake()
		conn.Close()
	}
	if err == nil || !strings.Contains(err.Error(), "protocol version") {
		t.Fatalf("a TLS 1.2 client: err = %v, want a protocol version refusal", err)
	}

	onlyW1 := ca.issue("w1")
	tr, w0Addr, err := coretest.NetworkTransport(agents[0], "", &onlyW1)
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	for _, tt := range []struct {
		hello  string
		rank   int
		served bool
	}{{"w0", 0, false}, {"w2", 2, false}, {"w1", 1, true}} {
		s, err := tr.Dial(ctx, w0Addr)
		if err != nil {
			t.Fatal(err)
		}
		s.Send(wire.HelloFrame(tt.hello, tt.rank, 0))
		s.Send(&wire.Frame{Kind: wire.FrameRequest, ID: 1, Method: "echo"})
		resp, err := s.Recv()
		if served := err == nil && resp.Status == wire.ReplyOK; served != tt.served {
			t.Errorf("a certificate naming only w1, speaking as %s: served = %v, want %v (%v)", tt.hello, served, tt.served, err)
		}
		if !tt.served {
			w0Log.wait(t, fmt.Sprintf(`refused a stream: a peer whose certificate names [w1] said it was worker %q`, tt.hello))
		}
		s.Close()
	}
}
