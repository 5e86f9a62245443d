package layering

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"golang.org/x/tools/go/packages"
)

const module = "apiary.dev/apiary"

// loadGraph reads the import graph of every package of the module, test
// files included, as module-relative paths.
func loadGraph(t *testing.T) map[string][]string {
	t.Helper()
	cfg := &packages.Config{Mode: packages.NeedName | packages.NeedImports, Tests: true, Dir: "../.."}
	pkgs, err := packages.Load(cfg, "./...")
	if err != nil {
		t.Fatal(err)
	}
	graph := map[string][]string{}
	for _, p := range pkgs {
		for _, e := range p.Errors {
			t.Errorf("%s: %v", p.PkgPath, e)
		}
		if strings.HasSuffix(p.PkgPath, ".test") {
			continue // the generated main of a test binary
		}
		from := Rel(module, strings.TrimSuffix(p.PkgPath, "_test"))
		if from == "" {
			continue
		}
		for imp := range p.Imports {
			if to := Rel(module, imp); to != "" && to != from && !slices.Contains(graph[from], to) {
				graph[from] = append(graph[from], to)
			}
		}
	}
	return graph
}

func readRules(t *testing.T) []Rule {
	t.Helper()
	doc, err := os.ReadFile("../../docs/architecture.md")
	if err != nil {
		t.Fatal(err)
	}
	rules, err := Parse(string(doc))
	if err != nil {
		t.Fatalf("docs/architecture.md: %v", err)
	}
	return rules
}

// TestImportGraphFollowsTheRules is the check CI runs.
func TestImportGraphFollowsTheRules(t *testing.T) {
	graph := loadGraph(t)
	if len(graph["regional"]) == 0 || len(graph["cmd/apiary"]) == 0 {
		t.Fatalf("the graph misses packages (regional: %v, cmd/apiary: %v): is the module root right?", graph["regional"], graph["cmd/apiary"])
	}
	for _, v := range Check(readRules(t), graph) {
		t.Error(v)
	}
}

// generatedRE is Go's convention for generated files (go help generate).
var generatedRE = regexp.MustCompile(`(?m)^// Code generated .* DO NOT EDIT\.$`)

// TestAPIIsGeneratedOnly: every Go file under api/ is generated code.
func TestAPIIsGeneratedOnly(t *testing.T) {
	files, err := filepath.Glob("../../api/apiary/v1/*.go")
	if err != nil || len(files) == 0 {
		t.Fatalf("no Go files under api/: %v", err)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if !generatedRE.Match(b) {
			t.Errorf("%s is not generated code (no \"// Code generated\" header): api/ holds only what `make proto` writes", f)
		}
	}
}

// TestCheckFindsForbiddenEdges: the rules of docs/architecture.md refuse
// each kind of edge the issue names, on a graph with one of each added.
func TestCheckFindsForbiddenEdges(t *testing.T) {
	rules := readRules(t)
	bad := map[string][]string{
		"placement":           {"internal/ids"},
		"agent":               {"regional"},
		"regional":            {"global/registry"},
		"global/router":       {"regional/taskstate"},
		"internal/jobspec":    {"cmd/apiary"},
		"shards":              {"loadtest"},
		"internal/federation": {"global/registry"},
	}
	got := map[string]bool{}
	for _, v := range Check(rules, bad) {
		got[v.From+" -> "+v.To] = true
	}
	for from, tos := range bad {
		for _, to := range tos {
			if !got[from+" -> "+to] {
				t.Errorf("edge %s -> %s is not refused by the rules", from, to)
			}
		}
	}
	ok := map[string][]string{
		"placement/sim":  {"placement"},
		"cmd/apiary":     {"regional", "global/router", "loadtest", "agent"},
		"loadtest/bench": {"loadtest", "regional/taskstate"},
		"regional":       {"placement", "shards", "internal/sovereignty"},
	}
	if v := Check(rules, ok); len(v) > 0 {
		t.Errorf("allowed edges refused: %v", v)
	}
}

func TestParseErrors(t *testing.T) {
	for doc, want := range map[string]string{
		"no block":                       "no ```layering block",
		"```layering\nforbid a -> b\n":   "not closed",
		"```layering\nallow a -> b\n```": `starts with "forbid "`,
		"```layering\nforbid a b\n```":   `needs "->"`,
		"```layering\nforbid -> b\n```":  "at least one pattern",
	} {
		if _, err := Parse(doc); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Parse(%q) = %v; want %q", doc, err, want)
		}
	}
}
