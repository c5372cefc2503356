package core

import (
	"errors"
	"math/bits"
	"sort"
	"sync/atomic"
	"time"
)

// peerStats counts the traffic with one member, both ways; atomics only, on the call path.
type peerStats struct {
	callsSent, callsServed atomic.Int64
	// bytesSent counts the requests sent to the member and the replies to its calls;
	// bytesReceived the replies from it and its requests.
	bytesSent, bytesReceived atomic.Int64
	inFlight                 atomic.Int64 // calls to the member not yet complete
	waiting                  atomic.Int64 // calls of the member read here, waiting for a slot
	failed                   [numErrorKinds]atomic.Int64
	// latency counts completed calls by the power of two of their microseconds.
	latency   [latencyBuckets]atomic.Int64
	latencyUs atomic.Int64 // their sum
}

const latencyBuckets = 40 // up to 2^39 us: 6 days

// Error kinds, as counted (see errorKind).
const (
	errorRemote = iota
	errorTimeout
	errorPeerLost
	errorCanceled
	errorOther
	numErrorKinds
)

var errorKindNames = [numErrorKinds]string{"remote", "timeout", "peer_lost", "canceled", "other"}

func errorKind(err error) int {
	var re *RemoteError
	switch {
	case errors.As(err, &re):
		return errorRemote
	case errors.Is(err, ErrTimeout):
		return errorTimeout
	case errors.Is(err, ErrPeerLost), errors.Is(err, ErrWorkerLeft):
		return errorPeerLost
	case errors.Is(err, ErrCanceled):
		return errorCanceled
	default:
		return errorOther
	}
}

// callStarted counts a call of req to the member.
func (s *peerStats) callStarted(req Message) {
	s.callsSent.Add(1)
	s.inFlight.Add(1)
	s.bytesSent.Add(int64(req.Size()))
}

// callDone counts the outcome of a call started at started.
func (s *peerStats) callDone(started time.Time, resp Message, err error) {
	s.inFlight.Add(-1)
	if err != nil {
		s.failed[errorKind(err)].Add(1)
	} else {
		s.bytesReceived.Add(int64(resp.Size()))
	}
	us := uint64(time.Since(started).Microseconds())
	s.latency[min(bits.Len64(us), latencyBuckets-1)].Add(1)
	s.latencyUs.Add(int64(us))
}

// PeerMetrics is the traffic with one worker, from this one's side.
type PeerMetrics struct {
	Name string `json:"name"`
	ID   int    `json:"id"`
	// CallsSent and CallsServed count the calls made to the worker and those it made here.
	CallsSent   int64 `json:"calls_sent"`
	CallsServed int64 `json:"calls_served"`
	// BytesSent and BytesReceived are the bytes of the messages each way, requests and
	// replies (payload and buffers).
	BytesSent     int64 `json:"bytes_sent"`
	BytesReceived int64 `json:"bytes_received"`
	// InFlight is the calls to the worker not yet complete.
	InFlight int64 `json:"in_flight"`
	// CallsWaiting is the worker's calls read here that wait for it to have fewer than
	// Config.MaxServedPerCaller in service: the worker's stream is not read meanwhile.
	CallsWaiting int64 `json:"calls_waiting"`
	// Errors counts the calls to the worker that failed, by kind: remote (the handler's
	// error), timeout, peer_lost, canceled, other.
	Errors map[string]int64 `json:"errors"`
	// LatencyUs holds upper bounds of the 50th, 90th and 99th percentiles of the completed
	// calls' latency, in microseconds (a power of two each: the histogram's buckets).
	LatencyUs map[string]int64 `json:"latency_us"`
	// LatencyHistogram counts the completed calls to the worker by bucket: bucket b holds
	// those that took under 2^b microseconds (and at least 2^(b-1)), the last the rest.
	LatencyHistogram []int64 `json:"-"`
	// LatencySumUs is the microseconds the completed calls took, together.
	LatencySumUs int64 `json:"-"`
}

// Metrics is a snapshot of an agent's traffic and memory.
type Metrics struct {
	Peers []PeerMetrics `json:"peers"`
	// ReceiveBytesInUse and ReceiveBudget: big messages being received, and the most they may take.
	ReceiveBytesInUse int64 `json:"receive_bytes_in_use"`
	ReceiveBudget     int64 `json:"receive_budget"`
	// Outstanding is the calls this agent made that are not complete.
	Outstanding int64 `json:"outstanding"`
	// OwnedRRefs counts the RRefs owned here that are referenced somewhere.
	OwnedRRefs int `json:"owned_rrefs"`
}

// Metrics returns a snapshot of the traffic with every member of the world, by member.
func (a *Agent) Metrics() Metrics {
	var m Metrics
	w := a.world()
	ids := make([]int, 0, len(w.byID))
	for id := range w.byID {
		ids = append(ids, id)
	}
	sort.Ints(ids)
	for _, id := range ids {
		mem := w.byID[id]
		s := &mem.stats
		p := PeerMetrics{
			Name: mem.info.Name, ID: id,
			CallsSent: s.callsSent.Load(), CallsServed: s.callsServed.Load(),
			BytesSent: s.bytesSent.Load(), BytesReceived: s.bytesReceived.Load(),
			InFlight: s.inFlight.Load(), CallsWaiting: s.waiting.Load(),
			Errors: map[string]int64{}, LatencyUs: map[string]int64{},
		}
		for k := range s.failed {
			p.Errors[errorKindNames[k]] = s.failed[k].Load()
		}
		counts := make([]int64, latencyBuckets)
		var total int64
		for b := range s.latency {
			counts[b] = s.latency[b].Load()
			total += counts[b]
		}
		p.LatencyHistogram, p.LatencySumUs = counts, s.latencyUs.Load()
		for _, q := range []struct {
			name string
			at   float64
		}{{"p50", 0.50}, {"p90", 0.90}, {"p99", 0.99}} {
			if total == 0 {
				continue
			}
			want, seen := int64(q.at*float64(total)+0.5), int64(0)
			for b, c := range counts {
				seen += c
				if seen >= max(want, 1) {
					p.LatencyUs[q.name] = int64(1) << b
					break
				}
			}
		}
		m.Peers = append(m.Peers, p)
	}
	m.ReceiveBytesInUse, m.ReceiveBudget = a.ReceiveMemory()
	m.Outstanding = a.outstanding.Load()
	m.OwnedRRefs = a.OwnedRRefs()
	return m
}
