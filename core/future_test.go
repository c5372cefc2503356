package core

import "testing"

// TestDiscardGivesTheReplyBack: a reply nobody will read goes back once it comes, whether the
// caller discards it before or after, and so does a remote error's detail.
func TestDiscardGivesTheReplyBack(t *testing.T) {
	for _, tt := range []struct {
		name   string
		before bool // discarded before the reply came
		remote bool // the reply is a remote error's detail
	}{{"discarded, then the reply came", true, false}, {"the reply came, then discarded", false, false},
		{"a remote error's detail", true, true}} {
		t.Run(tt.name, func(t *testing.T) {
			released := 0
			msg := Message{Payload: []byte("x"), release: func() { released++ }}
			f := newCallFuture()
			if tt.before {
				f.Discard()
			}
			if released != 0 {
				t.Fatal("released before the reply came")
			}
			if tt.remote {
				f.complete(Message{}, &RemoteError{Worker: "w", Message: "boom", Payload: msg})
			} else {
				f.complete(msg, nil)
			}
			if !tt.before {
				f.Discard()
			}
			if released != 1 {
				t.Fatalf("the reply was released %d times, want once", released)
			}
		})
	}
}
