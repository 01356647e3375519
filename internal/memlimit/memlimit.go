// Package memlimit gives the Go runtime a soft memory limit from the container's: the garbage
// collector then works harder as the heap nears the limit, instead of the kernel killing the process
// for a heap that garbage made large. GOMAXPROCS needs no such help: since Go 1.25 the runtime follows
// the container's CPU limit itself.
package memlimit

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
)

// Ratio is the share of the container's memory limit given to the Go runtime; the rest is for what
// the runtime does not count (the binary, thread stacks, the kernel's buffers).
const Ratio = 0.9

// noLimit is above any real limit: cgroup v1 reports "no limit" as a page-rounded int64 maximum.
const noLimit = 1 << 60

// Limit returns the memory limit of the process's cgroup read under root ("/" in production), or 0
// when there is none: cgroup v2's memory.max, else cgroup v1's memory.limit_in_bytes, at the
// cgroup's own path or at the hierarchy's root (inside a container the cgroup is usually mounted as
// the root).
func Limit(root string) (int64, error) {
	v2, v1, err := cgroupPaths(filepath.Join(root, "proc/self/cgroup"))
	if err != nil {
		return 0, err
	}
	var candidates []string
	if v2 != "" {
		candidates = append(candidates, filepath.Join(root, "sys/fs/cgroup", v2, "memory.max"))
	}
	candidates = append(candidates, filepath.Join(root, "sys/fs/cgroup/memory.max"))
	if v1 != "" {
		candidates = append(candidates, filepath.Join(root, "sys/fs/cgroup/memory", v1, "memory.limit_in_bytes"))
	}
	candidates = append(candidates, filepath.Join(root, "sys/fs/cgroup/memory/memory.limit_in_bytes"))
	for _, path := range candidates {
		b, err := os.ReadFile(path)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return 0, fmt.Errorf("read the memory limit: %w", err)
		}
		s := strings.TrimSpace(string(b))
		if s == "max" {
			return 0, nil
		}
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("read the memory limit: %s: %w", path, err)
		}
		if n <= 0 || n >= noLimit {
			return 0, nil
		}
		return n, nil
	}
	return 0, nil
}

// cgroupPaths returns the process's cgroup v2 path and cgroup v1 memory path from /proc/self/cgroup
// (either empty when absent); no file means no cgroups.
func cgroupPaths(file string) (v2, v1 string, err error) {
	f, err := os.Open(file)
	if errors.Is(err, fs.ErrNotExist) {
		return "", "", nil
	}
	if err != nil {
		return "", "", fmt.Errorf("read the process's cgroup: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		switch {
		case parts[0] == "0" && parts[1] == "":
			v2 = parts[2]
		case strings.Contains(","+parts[1]+",", ",memory,"):
			v1 = parts[2]
		}
	}
	return v2, v1, sc.Err()
}

// Apply sets the runtime's soft memory limit to Ratio of limit, unless GOMEMLIMIT is set (the
// operator's choice stands) or limit is 0. It returns the limit it set, or 0.
func Apply(limit int64, getenv func(string) string) int64 {
	if limit <= 0 || getenv("GOMEMLIMIT") != "" {
		return 0
	}
	soft := int64(float64(limit) * Ratio)
	debug.SetMemoryLimit(soft)
	return soft
}
