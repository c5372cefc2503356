package main

// The shared-memory side of the hostile peer: a raw client that does the transport's
// handshake itself, so it owns the region it hands the worker and can write anything into it.

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// shmAttacks run only against the shared-memory listener.
var shmAttacks = []attack{
	{"ring-head-ahead", func(p *peer, ctx context.Context) (string, string) {
		return p.corruptRing(ctx, func(region []byte) { binary.LittleEndian.PutUint64(region[0:], 1<<40) })
	}},
	{"ring-head-behind", func(p *peer, ctx context.Context) (string, string) {
		return p.corruptRing(ctx, func(region []byte) { binary.LittleEndian.PutUint64(region[0:], ^uint64(0)) })
	}},
	{"frame-over-limit", func(p *peer, ctx context.Context) (string, string) {
		return p.corruptRing(ctx, func(region []byte) {
			binary.LittleEndian.PutUint32(region[rawData:], 1<<30) // a 1 GiB frame's length
			binary.LittleEndian.PutUint64(region[0:], 4)
		})
	}},
	{"unsealed-region", func(p *peer, ctx context.Context) (string, string) { return p.badRegion(ctx, 0, rawRing) }},
	{"region-too-small", func(p *peer, ctx context.Context) (string, string) {
		return p.badRegion(ctx, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_SEAL, rawRing/2)
	}},
}

// The layout the transport uses (core/transport/shmtransport/region.go) for rings of 64 KiB:
// four 4 KiB control blocks (head at offset 0 of the dialer's small-frame ring), then four
// rings of 64 KiB (the small-frame lane's ring is a quarter of the bulk one, but 64 KiB at
// least), the dialer's small-frame ring first, then a 64 MiB landing area per direction.
const (
	rawCtrl    = 4096
	rawRing    = 64 << 10
	rawData    = 4 * rawCtrl // where the dialer's small-frame ring starts
	rawLanding = 64 << 20
	rawBytes   = 4*rawCtrl + 4*rawRing + 2*rawLanding
)

// shmName is the abstract socket name in a shared-memory address.
func shmName(addr string) (string, error) {
	rest, ok := strings.CutPrefix(addr, "shm://")
	_, name, ok2 := strings.Cut(rest, "/")
	if !ok || !ok2 {
		return "", fmt.Errorf("%q is not a shared-memory address", addr)
	}
	return name, nil
}

// rawShm does the handshake with a region sealed with seals, announcing rings of ringBytes
// but sized for rawRing ones; it returns the socket and the mapped region, or how the worker
// answered.
func (p *peer) rawShm(ctx context.Context, seals int, ringBytes int) (*net.UnixConn, []byte, error) {
	name, err := shmName(p.addr)
	if err != nil {
		return nil, nil, err
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", "@"+name)
	if err != nil {
		return nil, nil, err
	}
	conn := c.(*net.UnixConn)
	conn.SetDeadline(time.Now().Add(p.window))
	fail := func(err error) (*net.UnixConn, []byte, error) { conn.Close(); return nil, nil, err }
	hello := append([]byte("tprpcshm3"), binary.LittleEndian.AppendUint32(nil, uint32(len(p.token)))...)
	if _, err := conn.Write(append(hello, p.token...)); err != nil {
		return fail(err)
	}
	if err := expectByte(conn); err != nil {
		return fail(err)
	}
	fd, err := unix.MemfdCreate("hostile", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return fail(err)
	}
	defer unix.Close(fd)
	size := rawBytes
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		return fail(err)
	}
	if seals != 0 {
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, seals); err != nil {
			return fail(err)
		}
	}
	region, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return fail(err)
	}
	if _, _, err := conn.WriteMsgUnix(binary.LittleEndian.AppendUint32(nil, uint32(ringBytes)), unix.UnixRights(fd), nil); err != nil {
		unix.Munmap(region)
		return fail(err)
	}
	if err := expectByte(conn); err != nil {
		unix.Munmap(region)
		return fail(errRegionRefused)
	}
	conn.SetDeadline(time.Time{})
	return conn, region, nil
}

func expectByte(conn *net.UnixConn) error {
	var b [1]byte
	if _, err := conn.Read(b[:]); err != nil || b[0] != 'K' {
		return errShmRefused
	}
	return nil
}

var (
	errShmRefused    = errors.New("the worker refused the shared-memory stream")
	errRegionRefused = errors.New("the worker would not map the region")
)

// corruptRing sets a stream up honestly, writes into the region what corrupt does, wakes the
// worker, and reports whether it ended the stream.
func (p *peer) corruptRing(ctx context.Context, corrupt func(region []byte)) (string, string) {
	conn, region, err := p.rawShm(ctx, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_SEAL, rawRing)
	if err != nil {
		return dialOutcome(err)
	}
	defer unix.Munmap(region)
	defer conn.Close()
	corrupt(region)
	conn.Write([]byte{1})
	return awaitHangUp(conn, p.window, "wrote corrupt control words")
}

// badRegion offers a region the worker must refuse to map.
func (p *peer) badRegion(ctx context.Context, seals int, ringBytes int) (string, string) {
	conn, region, err := p.rawShm(ctx, seals, ringBytes)
	if err == errRegionRefused {
		return "refused", err.Error()
	}
	if err != nil {
		return dialOutcome(err)
	}
	unix.Munmap(region)
	conn.Close()
	return "mapped", "the worker mapped a region it should have refused"
}

// awaitHangUp waits up to d for the worker to close the socket.
func awaitHangUp(conn *net.UnixConn, d time.Duration, sent string) (string, string) {
	conn.SetReadDeadline(time.Now().Add(d))
	var b [64]byte
	for {
		if _, err := conn.Read(b[:]); err != nil {
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				return "silent", sent + "; the worker kept the stream"
			}
			return "dropped", sent + "; the worker ended the stream"
		}
	}
}

// cutShortFrame leaves a raw stream open whose first frame announces 1 MiB and carries 100
// bytes, until the program ends.
func (p *peer) cutShortFrame(ctx context.Context) string {
	conn, region, err := p.rawShm(ctx, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_SEAL, rawRing)
	if err != nil {
		return "; raw stream not opened: " + describe(err)
	}
	p.keep(func() { conn.Close(); unix.Munmap(region) })
	binary.LittleEndian.PutUint32(region[rawData:], 1<<20)
	binary.LittleEndian.PutUint64(region[0:], 104)
	conn.Write([]byte{1})
	return "; one raw stream whose first frame stops after 100 of its 1 MiB"
}
