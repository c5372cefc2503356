// Command delaylink joins two network interfaces as a bridge would, holding every packet for a
// fixed delay each way: what `tc netem delay` does, for kernels built without netem (make
// bench-hosts uses it then). Packets pass through whole, offload metadata included
// (PACKET_VNET_HDR), so TCP segments as large as the interfaces allow cross in one piece.
//
//	delaylink IFACE_A IFACE_B DELAY
package main

import (
	"fmt"
	"net"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// maxPacket is the longest packet with its virtio header: a GSO segment of up to 64 KiB.
const maxPacket = 1<<16 + 64

func main() {
	if len(os.Args) != 4 {
		fmt.Fprintln(os.Stderr, "usage: delaylink IFACE_A IFACE_B DELAY")
		os.Exit(2)
	}
	delay, err := time.ParseDuration(os.Args[3])
	if err != nil {
		fmt.Fprintln(os.Stderr, "delaylink:", err)
		os.Exit(2)
	}
	a, err := open(os.Args[1])
	if err == nil {
		var b *port
		if b, err = open(os.Args[2]); err == nil {
			go forward(a, b, delay)
			go forward(b, a, delay)
			fmt.Println("ready")
			stop := make(chan os.Signal, 1)
			signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
			<-stop
			return
		}
	}
	fmt.Fprintln(os.Stderr, "delaylink:", err)
	os.Exit(1)
}

// port is a raw packet socket bound to one interface.
type port struct {
	fd   int
	addr unix.SockaddrLinklayer
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

func open(name string) (*port, error) {
	ifc, err := net.InterfaceByName(name)
	if err != nil {
		return nil, err
	}
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, int(htons(unix.ETH_P_ALL)))
	if err != nil {
		return nil, fmt.Errorf("packet socket: %w", err)
	}
	if err := unix.SetsockoptInt(fd, unix.SOL_PACKET, unix.PACKET_VNET_HDR, 1); err != nil {
		return nil, fmt.Errorf("PACKET_VNET_HDR: %w", err)
	}
	unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, 64<<20)
	unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUF, 64<<20)
	p := &port{fd: fd, addr: unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: ifc.Index}}
	if err := unix.Bind(fd, &p.addr); err != nil {
		return nil, fmt.Errorf("bind to %s: %w", name, err)
	}
	return p, nil
}

type packet struct {
	data []byte
	due  time.Time
}

var buffers = sync.Pool{New: func() any { b := make([]byte, maxPacket); return &b }}

// forward sends every packet that arrives at from out of to, delay after it arrived.
func forward(from, to *port, delay time.Duration) {
	queue := make(chan packet, 1<<14)
	go func() {
		for p := range queue {
			if wait := time.Until(p.due); wait > 0 {
				time.Sleep(wait)
			}
			unix.Sendto(to.fd, p.data, 0, &to.addr)
			b := p.data[:cap(p.data)]
			buffers.Put(&b)
		}
	}()
	for {
		bp := buffers.Get().(*[]byte)
		n, sa, err := unix.Recvfrom(from.fd, *bp, 0)
		if err != nil {
			if err == unix.EINTR {
				continue
			}
			fmt.Fprintln(os.Stderr, "delaylink:", err)
			os.Exit(1)
		}
		if ll, ok := sa.(*unix.SockaddrLinklayer); ok && ll.Pkttype == unix.PACKET_OUTGOING {
			buffers.Put(bp) // one this program sent: not to go back
			continue
		}
		queue <- packet{data: (*bp)[:n], due: time.Now().Add(delay)}
	}
}
