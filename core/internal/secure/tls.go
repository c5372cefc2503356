package secure

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
)

// TLSFiles names the PEM files that put a world's traffic under mutual TLS: this worker's
// certificate and key, and the CA that signed every worker's certificate. Peers are
// authenticated by their certificate chaining to that CA (workers dial each other by IP
// address, so host names are not checked).
type TLSFiles struct {
	Cert, Key, CA string
}

// configs loads the files into the server's and the client's TLS configuration.
func (f TLSFiles) configs() (server, client *tls.Config, err error) {
	pair, err := tls.LoadX509KeyPair(f.Cert, f.Key)
	if err != nil {
		return nil, nil, fmt.Errorf("TLS certificate %s and key %s: %w", f.Cert, f.Key, err)
	}
	pem, err := os.ReadFile(f.CA)
	if err != nil {
		return nil, nil, fmt.Errorf("TLS CA: %w", err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(pem) {
		return nil, nil, fmt.Errorf("TLS CA %s holds no PEM certificate", f.CA)
	}
	// Every worker runs this code on both ends, so TLS 1.3 is always available.
	server = &tls.Config{
		Certificates: []tls.Certificate{pair},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    roots,
		MinVersion:   tls.VersionTLS13,
	}
	client = &tls.Config{
		Certificates: []tls.Certificate{pair},
		MinVersion:   tls.VersionTLS13,
		// Workers dial each other by IP address, so the default verification, which checks a
		// host name, is replaced by VerifyConnection (as crypto/tls documents): it checks the
		// chain against the world's CA on every connection, resumed ones included.
		InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			return verifyChain(cs.PeerCertificates, roots)
		},
	}
	return server, client, nil
}

func verifyChain(certs []*x509.Certificate, roots *x509.CertPool) error {
	if len(certs) == 0 {
		return errors.New("the peer sent no certificate")
	}
	inter := x509.NewCertPool()
	for _, c := range certs[1:] {
		inter.AddCert(c)
	}
	_, err := certs[0].Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}})
	return err
}
