// Package helmchart tests the Helm chart in outbox-cdc/: helm lint passes, and the manifests helm
// template renders hold what a two-replica deployment needs.
package helmchart

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/outbox-cdc/outbox-cdc/config"
	"github.com/outbox-cdc/outbox-cdc/internal/testenv"
)

// helmBinary finds helm: $HELM, else .dev/bin/helm (make helm installs it from the Go module proxy).
func helmBinary(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("needs the helm binary: skipped under -short")
	}
	if h := os.Getenv("HELM"); h != "" {
		return h
	}
	h := filepath.Join(testenv.RepoRoot(t), ".dev", "bin", "helm")
	if _, err := os.Stat(h); err != nil {
		t.Fatalf("helm not found at %s: install it with `make helm` (go install helm.sh/helm/v4/cmd/helm from the Go module proxy), or set HELM", h)
	}
	return h
}

// helm runs helm with args in this directory and returns its standard output.
func helm(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(helmBinary(t), args...)
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	err := cmd.Run()
	if err != nil {
		return out.String() + stderr.String(), err
	}
	return out.String(), nil
}

// manifest is one rendered Kubernetes object.
type manifest map[string]any

// get walks a path of map keys and list indexes ("spec", "template", 0, ...).
func (m manifest) get(path ...any) any {
	var cur any = map[string]any(m)
	for _, p := range path {
		switch k := p.(type) {
		case string:
			mm, ok := cur.(map[string]any)
			if !ok {
				return nil
			}
			cur = mm[k]
		case int:
			l, ok := cur.([]any)
			if !ok || k >= len(l) {
				return nil
			}
			cur = l[k]
		}
	}
	return cur
}

// render runs helm template with the given --set values and returns the objects by kind.
func render(t *testing.T, sets ...string) map[string]manifest {
	t.Helper()
	args := []string{"template", "prod", "outbox-cdc"}
	for _, s := range sets {
		args = append(args, "--set", s)
	}
	out, err := helm(t, args...)
	if err != nil {
		t.Fatalf("helm template: %v\n%s", err, out)
	}
	byKind := map[string]manifest{}
	dec := yaml.NewDecoder(strings.NewReader(out))
	for {
		var raw map[string]any // nested mappings decode as map[string]any too
		if err := dec.Decode(&raw); err != nil {
			break
		}
		if raw == nil {
			continue
		}
		m := manifest(raw)
		kind, _ := m["kind"].(string)
		if _, dup := byKind[kind]; dup {
			t.Fatalf("two %s objects", kind)
		}
		byKind[kind] = m
	}
	return byKind
}

func TestChartLints(t *testing.T) {
	if out, err := helm(t, "lint", "--strict", "outbox-cdc"); err != nil {
		t.Fatalf("helm lint: %v\n%s", err, out)
	}
}

func TestRenderedManifests(t *testing.T) {
	objs := render(t, "metrics.podMonitor.enabled=true", "metrics.prometheusRule.enabled=true")
	for _, kind := range []string{"Deployment", "ConfigMap", "PodDisruptionBudget", "ServiceAccount", "PodMonitor", "PrometheusRule"} {
		if objs[kind] == nil {
			t.Fatalf("no %s rendered", kind)
		}
	}
	if objs["Secret"] != nil {
		t.Error("the chart renders a Secret: passwords must come from one the operator creates")
	}
	dep := objs["Deployment"]
	if r := dep.get("spec", "replicas"); r != 2 {
		t.Errorf("replicas %v, want 2 (one streams, one waits as hot standby)", r)
	}
	podLabels := dep.get("spec", "template", "metadata", "labels").(map[string]any)
	c := manifest(dep.get("spec", "template", "spec", "containers", 0).(map[string]any))
	if p := c.get("readinessProbe", "httpGet", "path"); p != "/readyz?standby=ready" {
		t.Errorf("readiness probe %v", p)
	}
	if p := c.get("livenessProbe", "httpGet", "path"); p != "/healthz" {
		t.Errorf("liveness probe %v", p)
	}
	if p := c.get("ports", 0, "containerPort"); p != 9187 {
		t.Errorf("metrics port %v", p)
	}
	if r := c.get("resources", "requests", "memory"); r != "96Mi" {
		t.Errorf("memory request %v", r)
	}
	if r := c.get("resources", "limits", "memory"); r == nil {
		t.Error("no memory limit")
	}
	env, _ := c.get("env").([]any)
	var pgPassword manifest
	for _, e := range env {
		e := manifest(e.(map[string]any))
		if e["name"] == "PGPASSWORD" {
			pgPassword = e
		}
		if _, literal := e["value"]; literal && strings.Contains(strings.ToLower(e["name"].(string)), "password") {
			t.Errorf("env %s holds a literal value", e["name"])
		}
	}
	if pgPassword == nil || pgPassword.get("valueFrom", "secretKeyRef", "name") != "outbox-cdc" {
		t.Errorf("PGPASSWORD does not come from the Secret: %v", pgPassword)
	}
	if m := c.get("volumeMounts", 0, "mountPath"); m != "/etc/outbox-cdc" {
		t.Errorf("config mount %v", m)
	}
	if a := c.get("args"); !reflect.DeepEqual(a, []any{"run", "--config", "/etc/outbox-cdc/outbox-cdc.yaml"}) {
		t.Errorf("args %v", a)
	}

	// The configuration loads and validates as outbox-cdc would read it, and the pod outlives its
	// graceful stop.
	cm := objs["ConfigMap"]
	file := filepath.Join(t.TempDir(), "outbox-cdc.yaml")
	if err := os.WriteFile(file, []byte(cm.get("data", "outbox-cdc.yaml").(string)), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(file, func(string) (string, bool) { return "", false }, nil)
	if err != nil {
		t.Fatalf("the ConfigMap's configuration: %v", err)
	}
	if !strings.HasPrefix(cfg.Metrics.Addr, "0.0.0.0:") {
		t.Errorf("metrics.addr %s is not reachable by the probes", cfg.Metrics.Addr)
	}
	grace := dep.get("spec", "template", "spec", "terminationGracePeriodSeconds").(int)
	if time.Duration(grace)*time.Second <= cfg.ShutdownTimeout {
		t.Errorf("terminationGracePeriodSeconds %d does not outlast shutdown_timeout %s", grace, cfg.ShutdownTimeout)
	}

	pdb := objs["PodDisruptionBudget"]
	if pdb.get("spec", "minAvailable") != 1 || pdb.get("spec", "unhealthyPodEvictionPolicy") != "AlwaysAllow" {
		t.Errorf("PDB spec %v", pdb["spec"])
	}
	for k, v := range pdb.get("spec", "selector", "matchLabels").(map[string]any) {
		if podLabels[k] != v {
			t.Errorf("the PDB selects %s=%v, which the pods lack", k, v)
		}
	}
	pm := objs["PodMonitor"]
	if pm.get("spec", "podMetricsEndpoints", 0, "port") != "metrics" || pm.get("spec", "podMetricsEndpoints", 0, "path") != "/metrics" {
		t.Errorf("PodMonitor endpoints %v", pm.get("spec", "podMetricsEndpoints"))
	}
	for k, v := range pm.get("spec", "selector", "matchLabels").(map[string]any) {
		if podLabels[k] != v {
			t.Errorf("the PodMonitor selects %s=%v, which the pods lack", k, v)
		}
	}

	// One source for the alert rules: the PrometheusRule holds exactly deploy/prometheus's file.
	raw, err := os.ReadFile(filepath.Join("..", "prometheus", "outbox-cdc-alerts.yml"))
	if err != nil {
		t.Fatal(err)
	}
	var file2 map[string]any
	if err := yaml.Unmarshal(raw, &file2); err != nil {
		t.Fatal(err)
	}
	if got := objs["PrometheusRule"].get("spec", "groups"); !reflect.DeepEqual(got, file2["groups"]) {
		t.Errorf("the PrometheusRule's groups differ from deploy/prometheus/outbox-cdc-alerts.yml")
	}
}

// TestChartRefusesUnsafeValues: a password in postgres.url, or a metrics address the probes cannot
// reach, fails the rendering with the fix.
func TestChartRefusesUnsafeValues(t *testing.T) {
	for _, tt := range []struct{ set, want string }{
		{"config.postgres.url=postgres://u:secret@db:5432/app", "holds a password"},
		{`config.postgres.url=host=db user=u password=secret@`, "holds a password"},
		{"config.metrics.addr=127.0.0.1:9187", "loopback"},
		{"secrets.postgresPassword.name=", "secrets.postgresPassword.name"},
	} {
		out, err := helm(t, "template", "prod", "outbox-cdc", "--set", tt.set)
		if err == nil || !strings.Contains(out, tt.want) {
			t.Errorf("--set %s: %v, output lacks %q:\n%s", tt.set, err, tt.want, out)
		}
		if strings.Contains(out, "secret@") {
			t.Errorf("--set %s: the error repeats the password", tt.set)
		}
	}
	// Optional parts stay out unless asked for.
	objs := render(t, "podDisruptionBudget.enabled=false")
	for _, kind := range []string{"PodDisruptionBudget", "PodMonitor", "PrometheusRule"} {
		if objs[kind] != nil {
			t.Errorf("%s rendered though not enabled", kind)
		}
	}
}
