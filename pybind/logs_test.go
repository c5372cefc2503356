package pybind

import (
	"log/slog"
	"strings"
	"testing"
)

// Records reach Python as one C string: it must hold no NUL, and split on the separator it
// must give back every record, whatever bytes a record held.
func TestTakeLogsReturnsEveryRecordOfABatch(t *testing.T) {
	TakeLogs() // what earlier tests logged
	cases := []struct{ name, msg, want string }{
		{"plain", "first", "first"},
		{"a NUL from a peer's name", "peer a\x00b", `peer a\x00b`},
		{"the separator itself", "x" + LogRecordSeparator + "y", `x\x1ey`},
		{"lines of a stack", "panic\ngoroutine 1", "panic\ngoroutine 1"},
		{"invalid UTF-8 from a peer", "name \xff\xfe", "name \uFFFD"},
	}
	for _, c := range cases {
		slog.Warn(c.msg)
	}
	got := TakeLogs()
	if strings.Contains(got, "\x00") {
		t.Fatalf("TakeLogs returned a NUL, where a C string ends: %q", got)
	}
	records := strings.Split(got, LogRecordSeparator)
	if len(records) != len(cases) {
		t.Fatalf("got %d records, want %d: %q", len(records), len(cases), got)
	}
	for i, c := range cases {
		if want := "4\t" + c.want; records[i] != want {
			t.Errorf("%s: record %q, want %q", c.name, records[i], want)
		}
	}
}

func TestForPythonEscapesNUL(t *testing.T) {
	for in, want := range map[string]string{"py": "py", "py\x00evil": `py\x00evil`, "": "", "bad\xffname": "bad\uFFFDname"} {
		if got := forPython(in); got != want {
			t.Errorf("forPython(%q) = %q, want %q", in, got, want)
		}
	}
}
