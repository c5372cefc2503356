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
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tensorplay/tensorplay-rpc/core"
	"github.com/tensorplay/tensorplay-rpc/core/coretest"
	"github.com/tensorplay/tensorplay-rpc/core/transport/grpctransport"
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
// refuses a client with no certificate or one from another CA, at the store and at workers.
func TestTLSRefusesClientsWithoutAValidCertificate(t *testing.T) {
	dir := t.TempDir()
	world, stranger := throwawayCA(t, dir, "world"), throwawayCA(t, dir, "stranger")
	var served atomic.Int64
	handlers := map[string]core.Handler{
		"count": core.HandlerFunc(func(_ context.Context, req core.Message) (core.Message, error) {
			served.Add(1)
			return req, nil
		}),
	}
	cfgs := coretest.Configs(t, 2, coretest.Options{GRPC: true, Handlers: handlers, TLS: &world})
	agents := coretest.Start(t, cfgs).Agents
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := agents[0].Call(ctx, "w1", "count", core.Message{}); err != nil {
		t.Fatalf("a call inside the world: %v", err)
	}
	for name, files := range map[string]*core.TLSFiles{"no TLS": nil, "another CA": &stranger} {
		tr, err := grpctransport.New("", files)
		if err != nil {
			t.Fatal(err)
		}
		s, err := tr.Dial(ctx, coretest.GRPCAddr(agents[1]))
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
		t.Fatalf("handlers ran %d times, want only the world's own call", n)
	}
	intruder := cfgs[1]
	intruder.Name, intruder.TLS, intruder.InitTimeout = "intruder", &stranger, time.Second
	if _, err := core.Start(ctx, intruder); err == nil {
		t.Fatal("the store let in a worker with another CA's certificate")
	}
}

// TestTLSIsVersionThreeAndNamesBindWorkers: a client offering only TLS 1.2 is refused; in a
// world whose certificates name workers, a peer with a valid certificate can speak only as a
// worker its certificate names.
func TestTLSIsVersionThreeAndNamesBindWorkers(t *testing.T) {
	ca := newTestCA(t, t.TempDir(), "world")
	shared := ca.issue("workers", "w0", "w1", "w2")
	cfgs := coretest.Configs(t, 3, coretest.Options{GRPC: true, Handlers: echo, TLS: &shared})
	agents := coretest.Start(t, cfgs).Agents
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	pair, err := tls.LoadX509KeyPair(shared.Cert, shared.Key)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := tls.Dial("tcp", coretest.GRPCAddr(agents[1]), &tls.Config{
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
	tr, err := grpctransport.New("", &onlyW1)
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	for _, tt := range []struct {
		hello  string
		rank   int
		served bool
	}{{"w0", 0, false}, {"w2", 2, false}, {"w1", 1, true}} {
		s, err := tr.Dial(ctx, coretest.GRPCAddr(agents[0]))
		if err != nil {
			t.Fatal(err)
		}
		s.Send(wire.HelloFrame(tt.hello, tt.rank, 0))
		s.Send(&wire.Frame{Kind: wire.FrameRequest, ID: 1, Method: "echo"})
		resp, err := s.Recv()
		if served := err == nil && resp.Status == wire.ReplyOK; served != tt.served {
			t.Errorf("a certificate naming only w1, speaking as %s: served = %v, want %v (%v)", tt.hello, served, tt.served, err)
		}
		s.Close()
	}
}
