package shmtransport

import (
	"fmt"
	"os"
	"strings"
	"syscall"
)

// HostKey names this boot of this host and this network namespace. Two processes can share a
// region through an abstract Unix socket only if their keys are equal: abstract sockets live
// in a network namespace, and a key from another boot names a host that is gone.
func HostKey() (string, error) {
	boot, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return "", fmt.Errorf("read the boot id: %w", err)
	}
	var st syscall.Stat_t
	if err := syscall.Stat("/proc/self/ns/net", &st); err != nil {
		return "", fmt.Errorf("read the network namespace: %w", err)
	}
	return fmt.Sprintf("%s.%d", strings.TrimSpace(string(boot)), st.Ino), nil
}
