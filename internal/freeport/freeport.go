// Package freeport finds a loopback TCP port for a server the tests or tools start themselves.
package freeport

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
)

// Loopback returns a port of 127.0.0.1 that is free now, chosen below the kernel's ephemeral port
// range (net.ipv4.ip_local_port_range). A port from listening on port 0 comes from that range, and
// on a busy machine an outgoing connection took one before the server meant for it bound it ("could
// not bind IPv4 address ... Address already in use" in a CI run); below the range only another
// listener can take it. It falls back to port 0's answer when the range leaves no room below it.
func Loopback() (int, error) {
	low := 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if n, err := strconv.Atoi(f[0]); err == nil {
				low = n
			}
		}
	}
	const from = 10000
	if low > from+2000 {
		for range 100 {
			port := from + rand.IntN(low-from)
			if ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port)); err == nil {
				_ = ln.Close()
				return port, nil
			}
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free loopback port: %w", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}
