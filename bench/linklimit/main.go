// Command linklimit measures what a link between two hosts can do at best, for make
// bench-hosts: a small-message ping-pong and a one-way transfer over one plain TCP connection,
// with nothing but Go's runtime between the program and the socket.
//
//	linklimit serve ADDR
//	linklimit measure ADDR CALLS BYTES
//
// measure prints one JSON object: ping-pong p50 and p99 in microseconds, and one-way GB/s.
package main

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"sort"
	"strconv"
	"time"
)

func main() {
	if len(os.Args) < 3 {
		fmt.Fprintln(os.Stderr, "usage: linklimit serve ADDR | linklimit measure ADDR CALLS BYTES")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "serve":
		err = serve(os.Args[2])
	case "measure":
		calls, _ := strconv.Atoi(os.Args[3])
		size, _ := strconv.ParseInt(os.Args[4], 10, 64)
		err = measure(os.Args[2], calls, size)
	default:
		err = fmt.Errorf("unknown mode %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "linklimit:", err)
		os.Exit(1)
	}
}

// serve answers one client: each 8-byte message is echoed, except one announcing a transfer
// (its high bit set), whose bytes are read and acknowledged with one byte.
func serve(addr string) error {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	c, err := lis.Accept()
	if err != nil {
		return err
	}
	defer c.Close()
	var msg [8]byte
	buf := make([]byte, 1<<20)
	for {
		if _, err := io.ReadFull(c, msg[:]); err != nil {
			return nil // the client is done
		}
		n := binary.BigEndian.Uint64(msg[:])
		if n&(1<<63) == 0 {
			if _, err := c.Write(msg[:]); err != nil {
				return err
			}
			continue
		}
		if _, err := io.CopyBuffer(io.Discard, io.LimitReader(c, int64(n&^(1<<63))), buf); err != nil {
			return err
		}
		if _, err := c.Write(msg[:1]); err != nil {
			return err
		}
	}
}

func measure(addr string, calls int, size int64) error {
	var c net.Conn
	var err error
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if c, err = net.Dial("tcp", addr); err == nil || time.Now().After(deadline) {
			break
		}
	}
	if err != nil {
		return err
	}
	defer c.Close()
	var msg [8]byte
	samples := make([]time.Duration, 0, calls)
	for i := range calls + calls/10 {
		t0 := time.Now()
		binary.BigEndian.PutUint64(msg[:], uint64(i))
		if _, err := c.Write(msg[:]); err != nil {
			return err
		}
		if _, err := io.ReadFull(c, msg[:]); err != nil {
			return err
		}
		if i >= calls/10 { // the first tenth warms up
			samples = append(samples, time.Since(t0))
		}
	}
	sort.Slice(samples, func(i, j int) bool { return samples[i] < samples[j] })
	payload := make([]byte, size)
	var best time.Duration
	for range 10 { // the best of ten, the first warming the connection's windows
		t0 := time.Now()
		binary.BigEndian.PutUint64(msg[:], uint64(size)|1<<63)
		if _, err := c.Write(msg[:]); err != nil {
			return err
		}
		if _, err := c.Write(payload); err != nil {
			return err
		}
		if _, err := io.ReadFull(c, msg[:1]); err != nil {
			return err
		}
		if d := time.Since(t0); best == 0 || d < best {
			best = d
		}
	}
	return json.NewEncoder(os.Stdout).Encode(map[string]float64{
		"sync_p50_us": float64(samples[len(samples)/2]) / 1e3,
		"sync_p99_us": float64(samples[len(samples)*99/100]) / 1e3,
		"oneway_GBps": float64(size) / best.Seconds() / 1e9,
	})
}
