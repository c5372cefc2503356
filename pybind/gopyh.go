package pybind

// The bindings gopy generates import gopyh; importing it here keeps it in go.mod.
import _ "github.com/go-python/gopy/gopyh"
