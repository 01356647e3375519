package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// docPages are the pages whose links and commands the tests below check: the README, the
// changelog and every page under docs/.
func docPages(t *testing.T) []string {
	t.Helper()
	pages, err := filepath.Glob("docs/*.md")
	if err != nil || len(pages) < 10 {
		t.Fatalf("docs/*.md: %v (%d pages)", err, len(pages))
	}
	return append([]string{"README.md", "CHANGELOG.md"}, pages...)
}

// prose returns a page's lines outside fenced code blocks, and apart the lines of its shell blocks
// (```sh) — the commands a reader copies.
func prose(text string) (outside, code []string) {
	fenced, shell := false, false
	for _, line := range strings.Split(text, "\n") {
		if fence := strings.TrimSpace(line); strings.HasPrefix(fence, "```") {
			fenced, shell = !fenced, fence == "```sh"
			continue
		}
		if fenced {
			if shell {
				code = append(code, line)
			}
		} else {
			outside = append(outside, line)
		}
	}
	return outside, code
}

var (
	linkRE    = regexp.MustCompile(`\[[^\]]*\]\(([^)\s]+)\)`)
	headingRE = regexp.MustCompile(`^#+ (.+)$`)
	inlineRE  = regexp.MustCompile("`([^`]+)`")
)

// anchors returns the GitHub anchors of a page's headings.
func anchors(text string) map[string]bool {
	out := map[string]bool{}
	lines, _ := prose(text)
	for _, line := range lines {
		m := headingRE.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		slug := strings.Map(func(r rune) rune {
			switch {
			case r == ' ':
				return '-'
			case r == '-' || r == '_' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r > 127:
				return r
			}
			return -1
		}, strings.ToLower(strings.TrimSpace(m[1])))
		out[slug] = true
	}
	return out
}

// TestDocsLinksResolve: every relative link of the documentation names a file of the repository and,
// where it has one, a heading of that page.
func TestDocsLinksResolve(t *testing.T) {
	for _, page := range docPages(t) {
		data, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		lines, _ := prose(string(data))
		for _, line := range lines {
			for _, m := range linkRE.FindAllStringSubmatch(line, -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				path, frag, _ := strings.Cut(target, "#")
				file := page
				if path != "" {
					file = filepath.Join(filepath.Dir(page), path)
				}
				body, err := os.ReadFile(file)
				if err != nil {
					if info, serr := os.Stat(file); serr == nil && info.IsDir() {
						continue
					}
					t.Errorf("%s: link %q: %v", page, target, err)
					continue
				}
				if frag != "" && !anchors(string(body))[frag] {
					t.Errorf("%s: link %q: %s has no heading with that anchor", page, target, file)
				}
			}
		}
	}
}

// repoPathRE matches a path of this repository quoted in the documentation.
var repoPathRE = regexp.MustCompile(`^\.?/?(docs|scripts|sql|deploy|testdata|config|pipeline|router|replication|fleet|ops|bench|internal|e2e|inbox|examples|interop|outbox|checkpoint|metrics|\.ci|\.github)/[\w./-]*$`)

// TestDocsPathsExist: every repository path the documentation quotes exists (a path with a
// placeholder, <...> or *, is a pattern and is left alone).
func TestDocsPathsExist(t *testing.T) {
	for _, page := range docPages(t) {
		data, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range inlineRE.FindAllStringSubmatch(string(data), -1) {
			for _, word := range strings.Fields(m[1]) {
				word = strings.TrimRight(word, ".,;:)")
				if !repoPathRE.MatchString(word) {
					continue
				}
				if _, err := os.Stat(word); err != nil {
					t.Errorf("%s: %q does not exist", page, word)
				}
			}
		}
	}
}

// TestDocsCommandsRun: every `outbox-cdc` command line of the documentation names a command and flags
// the binary has, every `make` target exists, and every `go run` and script path is there.
func TestDocsCommandsRun(t *testing.T) {
	makefile, err := os.ReadFile("Makefile")
	if err != nil {
		t.Fatal(err)
	}
	targets := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^([\w-]+):`).FindAllStringSubmatch(string(makefile), -1) {
		targets[m[1]] = true
	}
	checked := 0
	for _, page := range docPages(t) {
		data, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		outside, code := prose(string(data))
		var commands []string
		for _, line := range outside {
			for _, m := range inlineRE.FindAllStringSubmatch(line, -1) {
				if strings.HasPrefix(m[1], "outbox-cdc ") || strings.HasPrefix(m[1], "make ") || strings.HasPrefix(m[1], "go run ") {
					commands = append(commands, m[1])
				}
			}
		}
		for _, line := range code {
			for _, part := range regexp.MustCompile(`&&|;|\|`).Split(line, -1) {
				commands = append(commands, strings.TrimSpace(part))
			}
		}
		for _, command := range commands {
			args := shellWords(command)
			for len(args) > 0 && strings.Contains(args[0], "=") && !strings.HasPrefix(args[0], "-") {
				args = args[1:] // VAR=value before the command
			}
			if len(args) == 0 {
				continue
			}
			switch args[0] {
			case "outbox-cdc", "bin/outbox-cdc", "./bin/outbox-cdc":
				checked++
				root := newRootCommand()
				root.InitDefaultVersionFlag()
				cmd, rest, err := root.Find(args[1:])
				if err != nil {
					t.Errorf("%s: %q: %v", page, command, err)
					continue
				}
				cmd.InitDefaultHelpFlag()
				if err := cmd.ParseFlags(rest); err != nil {
					t.Errorf("%s: %q: %v", page, command, err)
				}
			case "make":
				checked++
				for _, target := range args[1:] {
					if !strings.Contains(target, "=") && !strings.HasPrefix(target, "-") && !targets[target] {
						t.Errorf("%s: %q: the Makefile has no target %s", page, command, target)
					}
				}
			case "go":
				if len(args) > 2 && args[1] == "run" && strings.HasPrefix(args[2], "./") {
					checked++
					if _, err := os.Stat(args[2]); err != nil {
						t.Errorf("%s: %q: %v", page, command, err)
					}
				}
			default:
				if strings.HasPrefix(args[0], "scripts/") || strings.HasPrefix(args[0], "./scripts/") || strings.HasPrefix(args[0], ".ci/") {
					checked++
					if _, err := os.Stat(args[0]); err != nil {
						t.Errorf("%s: %q: %v", page, command, err)
					}
				}
			}
		}
	}
	if checked < 20 {
		t.Errorf("checked only %d commands: the extraction is broken", checked)
	}
}

// shellWords splits a command line as a shell would for the simple lines of the documentation:
// blanks separate words, quotes group them, a # starts a comment.
func shellWords(line string) []string {
	var words []string
	var cur strings.Builder
	quote, in := rune(0), false
	for _, r := range line {
		switch {
		case quote != 0 && r == quote:
			quote = 0
		case quote != 0:
			cur.WriteRune(r)
		case r == '\'' || r == '"':
			quote, in = r, true
		case r == '#' && !in:
			return words
		case r == ' ' || r == '\t':
			if in {
				words = append(words, cur.String())
				cur.Reset()
				in = false
			}
		default:
			cur.WriteRune(r)
			in = true
		}
	}
	if in {
		words = append(words, cur.String())
	}
	return words
}

// TestDesignImportRules: no package depends, directly or through another, on what docs/design.md's
// table "What never imports what" forbids it.
func TestDesignImportRules(t *testing.T) {
	data, err := os.ReadFile("docs/design.md")
	if err != nil {
		t.Fatal(err)
	}
	text := string(data)
	start := strings.Index(text, "\n## What never imports what\n")
	if start < 0 {
		t.Fatal(`docs/design.md has no section "What never imports what"`)
	}
	section := text[start+1:]
	if end := strings.Index(section, "\n## "); end > 0 {
		section = section[:end]
	}
	out, err := exec.Command("go", "list", "-f", `{{.ImportPath}}{{range .Deps}} {{.}}{{end}}`, "./...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	const module = "github.com/outbox-cdc/outbox-cdc"
	deps := map[string][]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		fields := strings.Fields(line)
		deps[fields[0]] = fields[1:]
	}
	rules := 0
	for _, line := range strings.Split(section, "\n") {
		cells := strings.Split(line, "|")
		if len(cells) != 5 || !strings.HasPrefix(strings.TrimSpace(cells[1]), "`") {
			continue
		}
		pkg := module + "/" + strings.Trim(strings.TrimSpace(cells[1]), "`")
		own, ok := deps[pkg]
		if !ok {
			t.Errorf("docs/design.md names %s, which is not a package of this module", pkg)
			continue
		}
		for _, m := range inlineRE.FindAllStringSubmatch(cells[3], -1) {
			rules++
			forbidden := m[1]
			for _, dep := range own {
				first, _, _ := strings.Cut(dep, "/")
				var hit bool
				switch {
				case forbidden == "module":
					hit = strings.HasPrefix(dep, module+"/")
				case forbidden == "third-party":
					hit = strings.Contains(first, ".")
				case strings.Contains(strings.SplitN(forbidden, "/", 2)[0], "."):
					hit = dep == forbidden || strings.HasPrefix(dep, forbidden+"/")
				default:
					hit = dep == module+"/"+forbidden || strings.HasPrefix(dep, module+"/"+forbidden+"/")
				}
				if hit {
					t.Errorf("%s depends on %s: docs/design.md says it never depends on %s", pkg, dep, forbidden)
				}
			}
		}
	}
	if rules < 10 {
		t.Errorf("read only %d rules from docs/design.md: the table's shape changed", rules)
	}
}
