//go:build tools

// Package tools pins the build tools: gopy v0.4.10 and the goimports it runs, with a golang.org/x/tools that compiles
// with current Go (gopy's own pin does not).
package tools

import (
	_ "github.com/go-python/gopy"
	_ "golang.org/x/tools/cmd/goimports"
)
