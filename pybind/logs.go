package pybind

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
)

// Go's log records go to Python's logging, not to stderr: the core logs through slog's default
// logger, which this package points at a buffer; Python's event thread drains it (TakeLogs)
// when an EventLogs says there is something, and Python logs each record under
// "tensorplay_rpc.core".

// LogRecordSeparator separates the records TakeLogs returns. Not NUL: gopy hands a Go string
// to Python as a C string, which ends at its first NUL, so every record after the first of a
// batch was lost (seen as missing warnings when the event thread fell behind under load).
const LogRecordSeparator = "\x1e"

// maxBufferedLogs bounds the records kept while no Python thread takes them.
const maxBufferedLogs = 1024

var (
	logLevel = func() *slog.LevelVar { v := new(slog.LevelVar); v.Set(slog.LevelWarn); return v }()
	logs     logBuffer
	// logReader is the agent whose event thread takes the records, if one runs.
	logReader atomic.Pointer[Agent]
)

func init() { slog.SetDefault(slog.New(pythonLogHandler{})) }

type logBuffer struct {
	mu      sync.Mutex
	records []string
	dropped int
}

func (b *logBuffer) add(record string) {
	b.mu.Lock()
	if len(b.records) >= maxBufferedLogs {
		b.records = b.records[1:]
		b.dropped++
	}
	b.records = append(b.records, record)
	first := len(b.records) == 1
	b.mu.Unlock()
	if a := logReader.Load(); a != nil && first {
		a.post(&Event{kind: EventLogs})
	}
}

// forPython readies a string a peer may have chosen for gopy, which hands strings to Python as
// C strings decoded as strict UTF-8: NUL is escaped ("py\x00anything" would arrive as "py") and
// invalid UTF-8 replaced (it would raise in Python and lose a whole batch of log records).
func forPython(s string) string {
	if strings.Contains(s, "\x00") {
		s = strings.ReplaceAll(s, "\x00", `\x00`)
	}
	return strings.ToValidUTF8(s, "\uFFFD")
}

// pythonLogHandler is the slog.Handler of the buffer.
type pythonLogHandler struct{ attrs []slog.Attr }

func (h pythonLogHandler) Enabled(_ context.Context, l slog.Level) bool { return l >= logLevel.Level() }

func (h pythonLogHandler) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	fmt.Fprintf(&b, "%d\t%s", int(r.Level), strings.TrimPrefix(r.Message, "tensorplay-rpc: "))
	for _, a := range h.attrs {
		fmt.Fprintf(&b, " %s=%v", a.Key, a.Value)
	}
	r.Attrs(func(a slog.Attr) bool {
		fmt.Fprintf(&b, " %s=%v", a.Key, a.Value)
		return true
	})
	// A separator inside a record (a peer's name, a remote error's text) is escaped as NUL is.
	logs.add(forPython(strings.ReplaceAll(b.String(), LogRecordSeparator, `\x1e`)))
	return nil
}

func (h pythonLogHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return pythonLogHandler{attrs: append(slices.Clone(h.attrs), attrs...)}
}

// WithGroup keeps the handler as it is: the core names no groups.
func (h pythonLogHandler) WithGroup(string) slog.Handler { return h }

// SetLogLevel sets the least level of the records that reach Python, in Python's numbers
// (10 debug, 20 info, 30 warning, 40 error).
func SetLogLevel(pythonLevel int) {
	switch {
	case pythonLevel <= 10:
		logLevel.Set(slog.LevelDebug)
	case pythonLevel <= 20:
		logLevel.Set(slog.LevelInfo)
	case pythonLevel <= 30:
		logLevel.Set(slog.LevelWarn)
	default:
		logLevel.Set(slog.LevelError)
	}
}

// TakeLogs returns the records logged since the last call, each "level<TAB>text" with slog's
// level (-4 debug, 0 info, 4 warning, 8 error), separated by LogRecordSeparator; "" if none. Records
// dropped while the buffer was full are counted in one more record.
func TakeLogs() string {
	logs.mu.Lock()
	records, dropped := logs.records, logs.dropped
	logs.records, logs.dropped = nil, 0
	logs.mu.Unlock()
	if dropped > 0 {
		records = append([]string{fmt.Sprintf("%d\t%d log records were dropped: no Python thread took them", int(slog.LevelWarn), dropped)}, records...)
	}
	return strings.Join(records, LogRecordSeparator)
}
