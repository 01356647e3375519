package memlimit

import (
	"math"
	"os"
	"path/filepath"
	"runtime/debug"
	"testing"
)

func TestLimit(t *testing.T) {
	for _, tc := range []struct {
		name  string
		files map[string]string
		want  int64
	}{
		{"no cgroups", nil, 0},
		{"v2 at the root", map[string]string{"proc/self/cgroup": "0::/\n", "sys/fs/cgroup/memory.max": "268435456\n"}, 268435456},
		{"v2 unlimited", map[string]string{"proc/self/cgroup": "0::/\n", "sys/fs/cgroup/memory.max": "max\n"}, 0},
		{"v2 at its own path", map[string]string{"proc/self/cgroup": "0::/kubepods/pod1/c1\n", "sys/fs/cgroup/kubepods/pod1/c1/memory.max": "100000000"}, 100000000},
		{"v1 at its own path", map[string]string{"proc/self/cgroup": "4:memory:/docker/abc\n1:cpu:/\n", "sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes": "536870912"}, 536870912},
		{"v1 unlimited", map[string]string{"proc/self/cgroup": "4:memory:/x\n", "sys/fs/cgroup/memory/memory.limit_in_bytes": "9223372036854771712"}, 0},
		{"v1 at the root", map[string]string{"proc/self/cgroup": "4:cpuacct,memory:/\n", "sys/fs/cgroup/memory/memory.limit_in_bytes": "1073741824"}, 1073741824},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			for path, content := range tc.files {
				p := filepath.Join(root, path)
				if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			got, err := Limit(root)
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Errorf("Limit = %d, want %d", got, tc.want)
			}
		})
	}
}

func TestLimitRefusesGarbage(t *testing.T) {
	root := t.TempDir()
	p := filepath.Join(root, "sys/fs/cgroup/memory.max")
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte("lots"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Limit(root); err == nil {
		t.Error("Limit read \"lots\" without an error")
	}
}

func TestApply(t *testing.T) {
	defer debug.SetMemoryLimit(math.MaxInt64)
	none := func(string) string { return "" }
	if got := Apply(0, none); got != 0 {
		t.Errorf("Apply(0) = %d, want 0", got)
	}
	if got := Apply(1000, func(k string) string {
		if k == "GOMEMLIMIT" {
			return "500MiB"
		}
		return ""
	}); got != 0 {
		t.Errorf("Apply with GOMEMLIMIT set = %d, want 0 (the operator's limit stands)", got)
	}
	if got := Apply(1000, none); got != 900 || debug.SetMemoryLimit(-1) != 900 {
		t.Errorf("Apply(1000) = %d (runtime: %d), want 900", got, debug.SetMemoryLimit(-1))
	}
}
