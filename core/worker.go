package core

import (
	"fmt"
	"regexp"

	"github.com/tensorplay/tensorplay-rpc/core/internal/secure"
)

// WorkerInfo identifies one worker of the world.
type WorkerInfo struct {
	Name string `msgpack:"name"`
	ID   int    `msgpack:"id"`
	Addr string `msgpack:"addr"`
}

// String formats the worker the way error messages name it.
func (w WorkerInfo) String() string { return fmt.Sprintf("WorkerInfo(id=%d, name=%s)", w.ID, w.Name) }

// MaxNameLength is the longest worker name accepted.
const MaxNameLength = 128

var validName = regexp.MustCompile(`^[A-Za-z0-9_:\-]+$`)

// ValidateName reports why name cannot name a worker, or nil if it can.
func ValidateName(name string) error {
	if !validName.MatchString(name) {
		return fmt.Errorf("worker name must match ^[A-Za-z0-9-_:]+$, but got %q", name)
	}
	if len(name) > MaxNameLength {
		return fmt.Errorf("worker name must be at most %d characters, but %q has %d", MaxNameLength, name, len(name))
	}
	return nil
}

// TLSFiles names the PEM files that put a world's traffic under mutual TLS (see
// Config.TLS): this worker's certificate and key, and the CA that signed every worker's.
type TLSFiles = secure.TLSFiles
