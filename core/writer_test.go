package core

import "testing"

// TestBigMessagesStartInQueueOrder: a big message that cannot start yet (it does not fit the
// interleave window beside one under way) is not passed by smaller ones queued after it, or a
// steady stream of those would starve it for ever.
func TestBigMessagesStartInQueueOrder(t *testing.T) {
	w := &frameWriter{}
	under := &outMessage{started: true, total: 10 << 20}
	big := &outMessage{total: interleaveWindow}
	small := &outMessage{total: 1 << 20}
	w.large = []*outMessage{big, under, small}
	w.underWay, w.underWayCount = under.total, 1
	if got := w.takeLarge(); got != under {
		t.Fatal("the message under way should be served while the big one waits")
	}
	w.large = append(w.large, under)
	if got := w.takeLarge(); got == small {
		t.Fatal("a smaller message started ahead of a big one queued before it")
	}
	w.finished(under)
	w.large = []*outMessage{big, small}
	if got := w.takeLarge(); got != big {
		t.Fatal("with nothing under way the big message should start first")
	}
}
