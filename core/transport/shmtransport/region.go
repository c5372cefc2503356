package shmtransport

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// A region holds the rings of one stream: two lanes (small frames, and the frames of big
// messages), each with a ring per direction; all four control blocks first, then the data
// areas, then a landing area per direction for big messages (placing.go). The memfd is sparse:
// only the pages written take memory. The dialer writes direction 0 of each lane and reads direction 1; the listener the
// other way round.
const (
	laneSmall = 0
	laneBulk  = 1

	ctrlBytes = 4096
	// MinRingBytes and MaxRingBytes bound a ring's data area (a power of two).
	MinRingBytes = 64 << 10
	MaxRingBytes = 64 << 20
	// requiredSeals keep a peer from shrinking the region under our mapping (a later access
	// would raise SIGBUS) or growing it.
	requiredSeals = unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_SEAL
)

// laneBytes is the data area of each ring of lane in a region for rings of ringBytes: the
// small-frame lane gets a quarter (a bigger frame streams through it).
func laneBytes(lane, ringBytes int) int {
	if lane == laneSmall {
		return max(MinRingBytes, ringBytes/4)
	}
	return ringBytes
}

func ringsBytes(ringBytes int) int {
	return 4*ctrlBytes + 2*laneBytes(laneSmall, ringBytes) + 2*laneBytes(laneBulk, ringBytes)
}

// regionBytes is the size of a region for rings of ringBytes: the rings, then a landing area
// per direction (placing.go).
func regionBytes(ringBytes int) int {
	return ringsBytes(ringBytes) + 2*LandingAreaBytes
}

// landingArea is the landing area written in direction dir of a region for rings of ringBytes.
func landingArea(mem []byte, dir, ringBytes int) []byte {
	at := ringsBytes(ringBytes) + dir*LandingAreaBytes
	return mem[at : at+LandingAreaBytes : at+LandingAreaBytes]
}

func validRingBytes(n int) bool {
	return n >= MinRingBytes && n <= MaxRingBytes && n&(n-1) == 0
}

// createRegion makes a sealed memfd region for rings of ringBytes and maps it. The memfd has
// no name in any file system: the memory is freed when the last process holding it (by fd or
// mapping) lets go, including by dying.
func createRegion(ringBytes int) (fd int, mem []byte, err error) {
	fd, err = unix.MemfdCreate("tensorplay-rpc", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return -1, nil, fmt.Errorf("memfd_create: %w", err)
	}
	fail := func(what string, err error) (int, []byte, error) {
		unix.Close(fd)
		return -1, nil, fmt.Errorf("%s: %w", what, err)
	}
	size := regionBytes(ringBytes)
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		return fail("size the shared region", err)
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, requiredSeals); err != nil {
		return fail("seal the shared region", err)
	}
	if mem, err = unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED); err != nil {
		return fail("map the shared region", err)
	}
	return fd, mem, nil
}

// mapPeerRegion maps a region a peer created, once it is shown to be sealed at the size its
// ring size implies.
func mapPeerRegion(fd int, ringBytes int) ([]byte, error) {
	if !validRingBytes(ringBytes) {
		return nil, fmt.Errorf("peer asks for rings of %d bytes, not a power of two in [%d, %d]", ringBytes, MinRingBytes, MaxRingBytes)
	}
	seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
	if err != nil {
		return nil, fmt.Errorf("peer's region is not a sealable memfd: %w", err)
	}
	if seals&requiredSeals != requiredSeals {
		return nil, fmt.Errorf("peer's region is not sealed against resizing (seals %#x)", seals)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("stat the peer's region: %w", err)
	}
	size := regionBytes(ringBytes)
	if st.Size != int64(size) {
		return nil, fmt.Errorf("peer's region has %d bytes, want %d", st.Size, size)
	}
	mem, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("map the peer's region: %w", err)
	}
	return mem, nil
}
