package freeport

import (
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
)

// TestLoopbackIsFreeAndBelowTheEphemeralRange checks that the port can be bound and, where the
// kernel says its ephemeral range, that it lies below it (where no outgoing connection takes it).
func TestLoopbackIsFreeAndBelowTheEphemeralRange(t *testing.T) {
	low := 0
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		low, _ = strconv.Atoi(strings.Fields(string(b))[0])
	}
	for range 20 {
		port, err := Loopback()
		if err != nil {
			t.Fatal(err)
		}
		if low > 12000 && (port < 10000 || port >= low) {
			t.Fatalf("port %d is not below the ephemeral range (from %d)", port, low)
		}
		ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			t.Fatalf("port %d cannot be bound: %v", port, err)
		}
		_ = ln.Close()
	}
}
