package bufpool

import "testing"

func TestPoolReusesBySizeClass(t *testing.T) {
	var p Pool
	tests := []struct {
		n, wantCap int
	}{
		{n: 1, wantCap: 1 << 16},
		{n: 1 << 16, wantCap: 1 << 16},
		{n: 1<<16 + 1, wantCap: 1 << 17},
		{n: 3 << 20, wantCap: 4 << 20},
	}
	for _, tt := range tests {
		b := p.Get(tt.n)
		if len(b) != tt.n || cap(b) != tt.wantCap {
			t.Fatalf("Get(%d): len %d cap %d, want cap %d", tt.n, len(b), cap(b), tt.wantCap)
		}
		b[0] = 42
		p.Put(b)
		again := p.Get(tt.n)
		if &again[0] != &b[0] {
			t.Fatalf("Get(%d) after Put did not reuse the buffer", tt.n)
		}
		p.Put(again)
	}
	if p.Idle() == 0 {
		t.Fatal("nothing kept idle")
	}
	p.Put(make([]byte, 100)) // not from the pool: ignored
}

func TestPutOncePutsBackOnTheFirstCallOnly(t *testing.T) {
	var p Pool
	put := p.PutOnce(p.Get(MinPooled), p.Get(2*MinPooled))
	put()
	put()
	if idle := p.Idle(); idle != 3*MinPooled {
		t.Fatalf("%d bytes idle after two calls, want %d", idle, 3*MinPooled)
	}
}
