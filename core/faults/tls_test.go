package faults

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tensorplay/tensorplay-rpc/core"
	"github.com/tensorplay/tensorplay-rpc/core/coretest"
)

// throwawayCA makes a CA and one certificate it signed, as PEM files in dir.
func throwawayCA(t *testing.T, dir, name string) core.TLSFiles {
	t.Helper()
	key := func() *ecdsa.PrivateKey {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	write := func(file, kind string, der []byte) string {
		path := filepath.Join(dir, file)
		if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	caKey, certKey := key(), key()
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name + " CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	certTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: name + " worker"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	certDER, err := x509.CreateCertificate(rand.Reader, certTmpl, ca, &certKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(certKey)
	if err != nil {
		t.Fatal(err)
	}
	return core.TLSFiles{
		CA:   write(name+"-ca.pem", "CERTIFICATE", caDER),
		Cert: write(name+"-cert.pem", "CERTIFICATE", certDER),
		Key:  write(name+"-key.pem", "EC PRIVATE KEY", keyDER),
	}
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
		tr, err := core.NewGRPCTransport("", files)
		if err != nil {
			t.Fatal(err)
		}
		s, err := tr.Dial(ctx, agents[1].Self().Addr)
		if err == nil {
			s.Send(&core.Frame{Kind: core.FrameHello, Method: "w0", CallerID: 0})
			s.Send(&core.Frame{Kind: core.FrameRequest, ID: 1, Method: "count"})
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
