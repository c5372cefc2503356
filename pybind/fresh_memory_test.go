package pybind

import (
	"bytes"
	"testing"
	"unsafe"
)

func TestWithinKeepsOnlyWholeAlignedBlocks(t *testing.T) {
	const block = 4096
	backing := make([]byte, 6*block)
	base := int((block - uintptr(unsafe.Pointer(&backing[0]))%block) % block) // backing[base] is aligned
	tests := []struct {
		name       string
		start, end int // relative to the aligned base
		wantStart  int
		wantLen    int
	}{
		{"aligned both ends", 0, 2 * block, 0, 2 * block},
		{"unaligned start", 1, 2 * block, block, block},
		{"unaligned end", 0, 2*block - 1, 0, block},
		{"both unaligned", 100, 3*block + 7, block, 2 * block},
		{"no whole block", 1, block + 1, 0, 0},
		{"empty", 0, 0, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			mem := backing[base+tt.start : base+tt.end]
			got := within(mem, block)
			if len(got) != tt.wantLen {
				t.Fatalf("within: %d bytes, want %d", len(got), tt.wantLen)
			}
			if tt.wantLen > 0 && &got[0] != &backing[base+tt.wantStart] {
				t.Fatalf("within starts at offset %d, want %d", uintptr(unsafe.Pointer(&got[0]))-uintptr(unsafe.Pointer(&backing[base])), tt.wantStart)
			}
		})
	}
}

// TestReadyFreshKeepsWhatTheMemoryHolds: the advice only readies pages; every byte, those
// around the advised range included, holds what it held.
func TestReadyFreshKeepsWhatTheMemoryHolds(t *testing.T) {
	mem := make([]byte, freshMemoryBytes+12345)
	for i := range mem {
		mem[i] = byte(i * 7)
	}
	want := bytes.Clone(mem)
	readyFresh(mem[3 : len(mem)-5])
	if !bytes.Equal(mem, want) {
		t.Fatal("readying the memory changed what it held")
	}
}
