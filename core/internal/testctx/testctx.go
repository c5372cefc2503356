// Package testctx gives tests the context their calls run under.
package testctx

import (
	"context"
	"testing"
	"time"
)

// Limit bounds every call a test makes: a call that never returns (a barrier that does not
// end, a lost reply) fails its test with its own error within a minute, instead of hanging
// until go test's -timeout stops the whole binary.
const Limit = time.Minute

// For returns a context that ends after Limit, or when the test ends.
func For(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), Limit)
	t.Cleanup(cancel)
	return ctx
}
