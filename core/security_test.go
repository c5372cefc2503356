package core

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// TestRefusalsAreLoggedOncePerHostPerInterval: a flood of refused connections makes one log
// line per host per interval, counting them, instead of one line each.
func TestRefusalsAreLoggedOncePerHostPerInterval(t *testing.T) {
	var out bytes.Buffer
	old := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&out, nil)))
	defer slog.SetDefault(old)
	l := newRefusalLog(time.Hour)
	for i := 0; i < 100; i++ {
		l.note("10.9.8.7:" + string(rune('0'+i%10)) + "1")
	}
	l.note("10.9.8.6:5")
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 2 || !strings.Contains(lines[0], "from=10.9.8.7") || !strings.Contains(lines[1], "from=10.9.8.6") {
		t.Fatalf("want one line per host, got:\n%s", out.String())
	}
	// Once the interval has passed, the next refusal reports how many were left unlogged.
	l.hosts["10.9.8.7"].logged = time.Now().Add(-2 * time.Hour)
	l.note("10.9.8.7:1")
	if !strings.Contains(out.String(), "count=100") {
		t.Fatalf("the second line should count the 99 unlogged refusals and this one:\n%s", out.String())
	}
}
