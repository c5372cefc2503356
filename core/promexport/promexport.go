// Package promexport serves an agent's metrics (core.Agent.Metrics) to Prometheus: calls,
// bytes, errors and latency per peer, the receive budget and the RRefs owned, read from the
// agent at each scrape, beside the Go runtime's and the process's own metrics.
package promexport

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/tensorplay/tensorplay-rpc/core"
)

// Metrics is what a collector reads at each scrape; *core.Agent has it.
type Metrics interface {
	Metrics() core.Metrics
	Self() core.WorkerInfo
}

type collector struct {
	src Metrics

	callsSent, callsServed, bytesSent, bytesReceived, inFlight, waiting, errors, latency *prometheus.Desc
	receiveInUse, receiveBudget, outstanding, ownedRRefs                                 *prometheus.Desc
}

// NewCollector returns a collector of src's metrics, labelled with its worker's name.
func NewCollector(src Metrics) prometheus.Collector {
	worker := prometheus.Labels{"worker": src.Self().Name}
	peer := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc("tensorplay_rpc_"+name, help, append([]string{"peer"}, labels...), worker)
	}
	own := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc("tensorplay_rpc_"+name, help, nil, worker)
	}
	return &collector{
		src:           src,
		callsSent:     peer("calls_sent_total", "Calls this worker made to the peer."),
		callsServed:   peer("calls_served_total", "Calls of the peer this worker served."),
		bytesSent:     peer("sent_bytes_total", "Bytes of requests sent to the peer and of replies to its calls."),
		bytesReceived: peer("received_bytes_total", "Bytes of replies from the peer and of its requests."),
		inFlight:      peer("calls_in_flight", "Calls to the peer not yet complete."),
		waiting:       peer("calls_waiting", "Calls of the peer read here that wait for a slot (MaxServedPerCaller)."),
		errors:        peer("call_errors_total", "Calls to the peer that failed, by kind.", "kind"),
		latency:       peer("call_duration_seconds", "Time from sending a call to the peer to its outcome."),
		receiveInUse:  own("receive_bytes_in_use", "Bytes of big messages being received now."),
		receiveBudget: own("receive_budget_bytes", "The most big messages being received may take."),
		outstanding:   own("calls_outstanding", "Calls this worker made that are not complete."),
		ownedRRefs:    own("owned_rrefs", "RRefs owned here that are referenced somewhere."),
	}
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.callsSent, c.callsServed, c.bytesSent, c.bytesReceived, c.inFlight, c.waiting, c.errors, c.latency, c.receiveInUse, c.receiveBudget, c.outstanding, c.ownedRRefs} {
		ch <- d
	}
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	m := c.src.Metrics()
	for _, p := range m.Peers {
		counter := func(d *prometheus.Desc, v int64, labels ...string) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), append([]string{p.Name}, labels...)...)
		}
		counter(c.callsSent, p.CallsSent)
		counter(c.callsServed, p.CallsServed)
		counter(c.bytesSent, p.BytesSent)
		counter(c.bytesReceived, p.BytesReceived)
		ch <- prometheus.MustNewConstMetric(c.inFlight, prometheus.GaugeValue, float64(p.InFlight), p.Name)
		ch <- prometheus.MustNewConstMetric(c.waiting, prometheus.GaugeValue, float64(p.CallsWaiting), p.Name)
		for kind, n := range p.Errors {
			counter(c.errors, n, kind)
		}
		ch <- latencyHistogram(c.latency, p)
	}
	ch <- prometheus.MustNewConstMetric(c.receiveInUse, prometheus.GaugeValue, float64(m.ReceiveBytesInUse))
	ch <- prometheus.MustNewConstMetric(c.receiveBudget, prometheus.GaugeValue, float64(m.ReceiveBudget))
	ch <- prometheus.MustNewConstMetric(c.outstanding, prometheus.GaugeValue, float64(m.Outstanding))
	ch <- prometheus.MustNewConstMetric(c.ownedRRefs, prometheus.GaugeValue, float64(m.OwnedRRefs))
}

// latencyHistogram turns the core's power-of-two buckets (bucket b: under 2^b us) into
// Prometheus's cumulative ones, in seconds; the last bucket is +Inf's.
func latencyHistogram(d *prometheus.Desc, p core.PeerMetrics) prometheus.Metric {
	buckets := make(map[float64]uint64, len(p.LatencyHistogram))
	var cumulative uint64
	for b, n := range p.LatencyHistogram {
		cumulative += uint64(n)
		if b < len(p.LatencyHistogram)-1 {
			buckets[float64(uint64(1)<<b)/1e6] = cumulative
		}
	}
	return prometheus.MustNewConstHistogram(d, cumulative, float64(p.LatencySumUs)/1e6, buckets, p.Name)
}

// Server serves one agent's metrics over HTTP at /metrics.
type Server struct {
	srv  *http.Server
	addr string
}

// Addr is the address the server listens on.
func (s *Server) Addr() string { return s.addr }

// Close stops the server, letting scrapes under way finish within ctx.
func (s *Server) Close(ctx context.Context) error { return s.srv.Shutdown(ctx) }

// Serve serves src's metrics, the Go runtime's and the process's at http://addr/metrics
// (port 0: a free port) until Close.
func Serve(addr string, src Metrics) (*Server, error) {
	reg := prometheus.NewRegistry()
	if err := errors.Join(
		reg.Register(NewCollector(src)),
		reg.Register(collectors.NewGoCollector()),
		reg.Register(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})),
	); err != nil {
		return nil, fmt.Errorf("register the metrics of %s: %w", src.Self().Name, err)
	}
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("serve the metrics of %s on %s: %w", src.Self().Name, addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	// A scraper that stalls must not hold a connection, or a goroutine, for long.
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 10 * time.Second, WriteTimeout: 30 * time.Second, MaxHeaderBytes: 16 << 10}
	go srv.Serve(lis) //nolint:errcheck // ends with Close
	return &Server{srv: srv, addr: lis.Addr().String()}, nil
}

// PortFor is the port a worker of local rank localRank serves its metrics on when its
// machine's workers share the base port: base + localRank, so each has its own.
func PortFor(base string, localRank int) (string, error) {
	p, err := strconv.Atoi(base)
	if err != nil || p < 0 || p+localRank > 65535 {
		return "", fmt.Errorf("metrics port %q must be a number from 0 to %d", base, 65535-localRank)
	}
	if p == 0 {
		return "0", nil
	}
	return strconv.Itoa(p + localRank), nil
}
