package config

import (
	"flag"
	"os"
	"reflect"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite docs/configuration.md's generated table")

const (
	referencePage  = "../docs/configuration.md"
	referenceBegin = "<!-- BEGIN config reference -->\n"
	referenceEnd   = "<!-- END config reference -->"
)

// TestConfigurationReferenceIsCurrent: the table of docs/configuration.md is the one reference.go
// renders (`make docs` rewrites it), so the page and the keys Load reads cannot drift apart.
func TestConfigurationReferenceIsCurrent(t *testing.T) {
	data, err := os.ReadFile(referencePage)
	if err != nil {
		t.Fatal(err)
	}
	text := string(data)
	begin, end := strings.Index(text, referenceBegin), strings.Index(text, referenceEnd)
	if begin < 0 || end < begin {
		t.Fatalf("%s lacks the markers %q and %q around the table", referencePage, referenceBegin, referenceEnd)
	}
	want := referenceTable()
	got := text[begin+len(referenceBegin) : end]
	if got == want {
		return
	}
	if *update {
		if err := os.WriteFile(referencePage, []byte(text[:begin+len(referenceBegin)]+want+text[end:]), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Errorf("%s's table is not config/reference.go's: run `make docs` (go test ./config -run TestConfigurationReferenceIsCurrent -update)", referencePage)
}

// TestEveryKeyIsDocumented: every key the file, the environment and the flags can set has a row in the
// reference (a family row, "postgres.columns.*", covers its keys), and every row names keys that exist.
func TestEveryKeyIsDocumented(t *testing.T) {
	rows := map[string]bool{}
	var families []string
	for _, r := range reference {
		for _, k := range r.keys {
			if strings.HasSuffix(k, ".*") {
				families = append(families, strings.TrimSuffix(k, "*"))
			}
			rows[k] = true
		}
	}
	documented := func(key string) bool {
		if rows[key] {
			return true
		}
		for _, f := range families {
			if strings.HasPrefix(key, f) {
				return true
			}
		}
		return false
	}
	known := map[string]bool{}
	for _, s := range settings {
		known[s.Key] = true
		if !documented(s.Key) {
			t.Errorf("%s (%s) has no row in config/reference.go", s.Key, s.Env)
		}
	}
	for _, k := range yamlKeys(reflect.TypeOf(Config{}), "") {
		known[k] = true
		if !documented(k) {
			t.Errorf("file key %s has no row in config/reference.go", k)
		}
	}
	for k := range rows {
		family := strings.HasSuffix(k, ".*")
		found := known[k]
		for kk := range known {
			found = found || (family && strings.HasPrefix(kk, strings.TrimSuffix(k, "*")))
		}
		if !found {
			t.Errorf("config/reference.go documents %s, which no setting or file key is", k)
		}
	}
	if len(yamlKeys(reflect.TypeOf(Config{}), "")) < len(settings) {
		t.Errorf("found %d file keys for %d settings: the walk of Config misses keys", len(yamlKeys(reflect.TypeOf(Config{}), "")), len(settings))
	}
}

// yamlKeys lists the dotted keys a configuration file can hold under prefix: the leaves of typ's yaml
// tags (a list of structures or a map is one key).
func yamlKeys(typ reflect.Type, prefix string) []string {
	var keys []string
	for i := 0; i < typ.NumField(); i++ {
		f := typ.Field(i)
		name := strings.Split(f.Tag.Get("yaml"), ",")[0]
		if !f.IsExported() || name == "-" || name == "" {
			continue
		}
		if f.Type.Kind() == reflect.Struct {
			keys = append(keys, yamlKeys(f.Type, prefix+name+".")...)
			continue
		}
		keys = append(keys, prefix+name)
	}
	return keys
}
