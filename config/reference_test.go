package config

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// TestEveryKeyIsDocumented: every key the environment and flags can set has a row in the README's
// configuration table (a row may name several keys: "`kafka.tls.ca_file`, `cert_file`", or a family:
// "`postgres.columns.*`"), so that a key added without its entry fails here.
func TestEveryKeyIsDocumented(t *testing.T) {
	data, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	text := string(data)
	start := strings.Index(text, "\n## Configuration\n")
	if start < 0 {
		t.Fatal("README.md has no Configuration section")
	}
	section := text[start:]
	if end := strings.Index(section[1:], "\n## "); end > 0 {
		section = section[:end+1]
	}
	documented := map[string]bool{}
	var families []string
	codeRE := regexp.MustCompile("`([^`]+)`")
	for _, line := range strings.Split(section, "\n") {
		if !strings.HasPrefix(line, "| `") {
			continue
		}
		first := strings.Split(line, "|")[1]
		parent := ""
		for i, m := range codeRE.FindAllStringSubmatch(first, -1) {
			key := m[1]
			if i == 0 {
				parent = key[:strings.LastIndex(key, ".")+1]
			} else if !strings.Contains(key, ".") || !strings.HasPrefix(key, strings.SplitN(parent, ".", 2)[0]+".") {
				key = parent + key // "`kafka.tls.ca_file`, `cert_file`": cert_file is kafka.tls.cert_file
			}
			if strings.HasSuffix(key, ".*") {
				families = append(families, strings.TrimSuffix(key, "*"))
			}
			documented[key] = true
		}
	}
	for _, s := range settings {
		if documented[s.Key] {
			continue
		}
		inFamily := false
		for _, f := range families {
			inFamily = inFamily || strings.HasPrefix(s.Key, f)
		}
		if !inFamily {
			t.Errorf("%s (%s) has no row in the README's configuration table", s.Key, s.Env)
		}
	}
}
