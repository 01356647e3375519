// Package helmchart tests the Helm chart in outbox-cdc/: helm lint passes, and the manifests helm
// template renders hold what a two-replica deployment needs.
package helmchart

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
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
	h := filepath.Join(testenv.DevDir(t), "bin", "helm")
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
	var args []string
	for _, s := range sets {
		args = append(args, "--set", s)
	}
	return renderWith(t, args...)
}

// renderWith renders the chart as release prod with helm template's further arguments.
func renderWith(t *testing.T, extra ...string) map[string]manifest {
	t.Helper()
	args := append([]string{"template", "prod", "outbox-cdc"}, extra...)
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
	if pgPassword == nil || pgPassword.get("valueFrom", "secretKeyRef", "name") != "prod-outbox-cdc" {
		t.Errorf("PGPASSWORD does not come from the release's Secret: %v", pgPassword)
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
	groups, _ := objs["PrometheusRule"].get("spec", "groups").([]any)
	if len(groups) != len(file2["groups"].([]any))+1 || !reflect.DeepEqual(groups[:len(groups)-1], file2["groups"]) {
		t.Fatalf("the PrometheusRule's groups are not deploy/prometheus/outbox-cdc-alerts.yml's and the release's own")
	}
	// The release's own rule: no series of this release at all, whatever other releases report; the
	// PodMonitor sets the job it looks for.
	own, _ := yaml.Marshal(groups[len(groups)-1])
	for _, want := range []string{"OutboxCdcReleaseAbsent", `namespace="`, `job="prod-outbox-cdc"`} {
		if !strings.Contains(string(own), want) {
			t.Errorf("the release's own rule group lacks %s:\n%s", want, own)
		}
	}
	relabel, _ := yaml.Marshal(pm.get("spec", "podMetricsEndpoints"))
	if !strings.Contains(string(relabel), "targetLabel: job") || !strings.Contains(string(relabel), "prod-outbox-cdc") {
		t.Errorf("the PodMonitor does not set the job the release's rule looks for:\n%s", relabel)
	}
}

// TestChartRefusesUnsafeValues: a password in postgres.url, or a metrics address the probes cannot
// reach, fails the rendering with the fix.
func TestChartRefusesUnsafeValues(t *testing.T) {
	for _, tt := range []struct{ set, want string }{
		{"config.postgres.url=postgres://u:secret@db:5432/app", "holds a password"},
		{`config.postgres.url=host=db user=u password=secret@`, "holds a password"},
		{"config.metrics.addr=127.0.0.1:9187", "loopback"},
		// values.schema.json: wrong types and unknown keys never reach the cluster.
		{"replicaCount=two", "replicaCount"},
		{"imagee.tag=1.0", "imagee"},
		{"image.digest=latest", "digest"},
		{"config.kafka.delivery=exactly_once", "delivery"},
		{"metrics.podMonitor.enabld=true", "enabld"},
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

// TestChartForRealClusters: the image pinned by digest, the Secret named after the release by default
// (two releases in one namespace never share one), and extra volumes mounted (TLS material for Kafka
// and PostgreSQL).
func TestChartForRealClusters(t *testing.T) {
	digest := "sha256:" + strings.Repeat("ab", 32)
	objs := render(t, "image.digest="+digest,
		"extraVolumes[0].name=kafka-tls", "extraVolumes[0].secret.secretName=kafka-client-tls",
		"extraVolumeMounts[0].name=kafka-tls", "extraVolumeMounts[0].mountPath=/etc/tls/kafka", "extraVolumeMounts[0].readOnly=true")
	dep, err := yaml.Marshal(objs["Deployment"])
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"image: ghcr.io/outbox-cdc/outbox-cdc@" + digest, "secretName: kafka-client-tls", "mountPath: /etc/tls/kafka", "name: prod-outbox-cdc"} {
		if !strings.Contains(string(dep), want) {
			t.Errorf("the Deployment lacks %q:\n%s", want, dep)
		}
	}
	tagged, err := yaml.Marshal(render(t, "image.tag=v1.2.3")["Deployment"])
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(tagged), "image: ghcr.io/outbox-cdc/outbox-cdc:v1.2.3") {
		t.Errorf("image.tag not used:\n%s", tagged)
	}
	// By default the image is the one a release of the chart's appVersion publishes: the release
	// workflow tags the image with the git tag (v1.2.3) and packages the chart with that appVersion.
	chart, err := os.ReadFile(filepath.Join("outbox-cdc", "Chart.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var meta struct {
		AppVersion string `yaml:"appVersion"`
	}
	if err := yaml.Unmarshal(chart, &meta); err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`^v\d+\.\d+\.\d+`).MatchString(meta.AppVersion) {
		t.Errorf("appVersion %q is not a release tag (vX.Y.Z)", meta.AppVersion)
	}
	def, err := yaml.Marshal(render(t)["Deployment"])
	if err != nil {
		t.Fatal(err)
	}
	if want := "image: ghcr.io/outbox-cdc/outbox-cdc:" + meta.AppVersion; !strings.Contains(string(def), want) {
		t.Errorf("the default image is not %q:\n%s", want, def)
	}
}

// TestChartRunsAFleet: with sources, the chart renders one configuration with every source (its
// password a file mounted from its own Secret, no password in any URL), replicas that name themselves
// by pod in the group, and a readiness probe that one source's database cannot fail; a source URL
// holding a password and a source key outbox-cdc does not take are refused.
func TestChartRunsAFleet(t *testing.T) {
	values := filepath.Join(t.TempDir(), "fleet.yaml")
	doc := `
replicaCount: 3
sources:
  - name: orders
    passwordSecret: {name: orders-db, key: password}
    config:
      postgres: {url: "postgres://outbox_cdc@orders-db:5432/orders", slot: orders}
      routing: {topic: "orders.{event_type}"}
  - name: billing
    passwordSecret: {name: billing-db, key: pw}
    config:
      postgres: {url: "postgres://outbox_cdc@billing-db:5432/billing", slot: billing}
      kafka: {delivery: exactly-once}
`
	if err := os.WriteFile(values, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	objs := renderWith(t, "-f", values)
	dep := objs["Deployment"]
	if r := dep.get("spec", "replicas"); r != 3 {
		t.Errorf("replicas %v, want 3", r)
	}
	text, err := yaml.Marshal(dep)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"secretName: orders-db", "secretName: billing-db", "mountPath: /etc/outbox-cdc-passwords/orders",
		"mountPath: /etc/outbox-cdc-passwords/billing", "name: OUTBOX_CDC_FLEET_INSTANCE", "fieldPath: metadata.name", "path: /healthz"} {
		if !strings.Contains(string(text), want) {
			t.Errorf("the Deployment lacks %q", want)
		}
	}
	if strings.Contains(string(text), "name: PGPASSWORD") {
		t.Error("the fleet's pods read PGPASSWORD from a Secret no source needs")
	}

	// The configuration, with the mounted password files where the pod has them, loads as outbox-cdc
	// reads it: both sources, each with its own password.
	dir := t.TempDir()
	for name, key := range map[string]string{"orders": "password", "billing": "pw"} {
		if err := os.MkdirAll(filepath.Join(dir, name), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name, key), []byte("secret-of-"+name+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	cfgText := objs["ConfigMap"].get("data", "outbox-cdc.yaml").(string)
	file := filepath.Join(t.TempDir(), "outbox-cdc.yaml")
	if err := os.WriteFile(file, []byte(strings.ReplaceAll(cfgText, "/etc/outbox-cdc-passwords/", dir+"/")), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(file, func(string) (string, bool) { return "", false }, nil)
	if err != nil {
		t.Fatalf("the ConfigMap's configuration: %v\n%s", err, cfgText)
	}
	srcs := cfg.Sources()
	if len(srcs) != 2 || srcs[0].Name != "orders" || srcs[1].Kafka.Delivery != config.DeliveryExactlyOnce {
		t.Fatalf("sources %+v", srcs)
	}
	for _, s := range srcs {
		if !strings.Contains(s.Postgres.URL, ":secret-of-"+s.Name+"@") {
			t.Errorf("source %s does not take its own password", s.Name)
		}
	}

	// The fleet's group is the release, whatever its sources list holds.
	if cfg.Fleet.Group != "prod-outbox-cdc" {
		t.Errorf("fleet.group %q, want the release's name", cfg.Fleet.Group)
	}

	for name, bad := range map[string]string{
		"a password in a source URL": "sources[0].config.postgres.url=postgres://u:pw@h:5432/db",
		"a key a source cannot set":  "sources[0].config.log.level=debug",
	} {
		if out, err := helm(t, "template", "prod", "outbox-cdc", "-f", values, "--set", bad); err == nil {
			t.Errorf("%s: rendered; want a refusal\n%s", name, out)
		}
	}
}

// TestChartProtectsTheAdminAPI: the admin token Secret is mounted and named by
// metrics.admin_token_file, and a NetworkPolicy admits the metrics port from the release's namespace
// and the monitoring namespace only.
func TestChartProtectsTheAdminAPI(t *testing.T) {
	objs := render(t, "secrets.adminToken.name=ops-admin")
	text, err := yaml.Marshal(objs["Deployment"])
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"secretName: ops-admin", "mountPath: /etc/outbox-cdc-admin"} {
		if !strings.Contains(string(text), want) {
			t.Errorf("the Deployment lacks %q", want)
		}
	}
	cfgText := objs["ConfigMap"].get("data", "outbox-cdc.yaml").(string)
	if !strings.Contains(cfgText, "admin_token_file: /etc/outbox-cdc-admin/admin-token") {
		t.Errorf("the configuration does not name the token file:\n%s", cfgText)
	}
	np, ok := objs["NetworkPolicy"]
	if !ok {
		t.Fatal("no NetworkPolicy")
	}
	npText, err := yaml.Marshal(np)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"port: metrics", "podSelector: {}", "kubernetes.io/metadata.name: monitoring", "- Ingress"} {
		if !strings.Contains(string(npText), want) {
			t.Errorf("the NetworkPolicy lacks %q:\n%s", want, npText)
		}
	}
	if _, ok := render(t, "networkPolicy.enabled=false")["NetworkPolicy"]; ok {
		t.Error("networkPolicy.enabled=false still renders one")
	}
}
