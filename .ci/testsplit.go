//go:build ignore

// testsplit checks that `make test` and `make test-fault` together run
// every test exactly once: it lists the Test, Example and Fuzz functions of
// every package (go list for the test files, with build constraints
// applied; go/parser for the functions) and decides, as `go test` does for
// a top-level name, which of the two targets runs each one. It exits 1,
// naming them, when a test is in neither target or in both, or when a name
// of the fault list is no test of a fault package (a stale entry); else it
// prints one line per package with its counts.
//
// Usage (the Makefile's test-split-check passes its own variables):
//
//	go run .ci/testsplit.go -test-pkgs './...' -test-skip '^(TestA|TestB)$' \
//	    -fault-pkgs './regional ./loadtest' -fault-run '^(TestA|TestB)$'
package main

import (
	"bufio"
	"bytes"
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"unicode"
	"unicode/utf8"
)

func main() {
	testPkgs := flag.String("test-pkgs", "./...", "packages `make test` runs (space-separated patterns)")
	testSkip := flag.String("test-skip", "", "the -skip regexp of `make test`")
	faultPkgs := flag.String("fault-pkgs", "", "packages `make test-fault` runs (space-separated patterns)")
	faultRun := flag.String("fault-run", "", "the -run regexp of `make test-fault`")
	dockerPkgs := flag.String("docker-pkgs", "", "packages `make test-docker` runs (space-separated patterns)")
	dockerRun := flag.String("docker-run", "", "the -run regexp of `make test-docker`")
	flag.Parse()
	if err := run(*testPkgs, *testSkip, *faultPkgs, *faultRun, *dockerPkgs, *dockerRun); err != nil {
		fmt.Fprintln(os.Stderr, "testsplit:", err)
		os.Exit(1)
	}
}

type pkg struct {
	path, dir string
	files     []string
}

func run(testPkgs, testSkip, faultPkgs, faultRun, dockerPkgs, dockerRun string) error {
	for name, re := range map[string]string{"-test-skip": testSkip, "-fault-run": faultRun} {
		if re == "" {
			return fmt.Errorf("%s: is required", name)
		}
		// go test splits -run and -skip at '/' into one pattern per subtest
		// level; the split is by top-level name only, so refuse a '/'.
		if strings.Contains(re, "/") {
			return fmt.Errorf("%s %q: must not contain '/' (the split is by top-level test name)", name, re)
		}
	}
	skipRE, err := regexp.Compile(testSkip)
	if err != nil {
		return fmt.Errorf("-test-skip: %w", err)
	}
	runRE, err := regexp.Compile(faultRun)
	if err != nil {
		return fmt.Errorf("-fault-run: %w", err)
	}
	dockerRE := regexp.MustCompile(`^$`) // none
	if dockerRun != "" {
		if dockerRE, err = regexp.Compile(dockerRun); err != nil {
			return fmt.Errorf("-docker-run: %w", err)
		}
	}
	inTest, err := list(strings.Fields(testPkgs))
	if err != nil {
		return err
	}
	inFault, err := list(strings.Fields(faultPkgs))
	if err != nil {
		return err
	}
	inDocker := map[string]pkg{}
	if dockerPkgs != "" {
		if inDocker, err = list(strings.Fields(dockerPkgs)); err != nil {
			return err
		}
	}
	all := map[string]pkg{}
	for _, m := range []map[string]pkg{inTest, inFault, inDocker} {
		for k, p := range m {
			all[k] = p
		}
	}
	var paths []string
	for k := range all {
		paths = append(paths, k)
	}
	sort.Strings(paths)
	var problems []string
	faultNames := map[string]bool{}
	total := 0
	for _, path := range paths {
		p := all[path]
		names, err := testFuncs(p)
		if err != nil {
			return err
		}
		nTest, nFault, nDocker := 0, 0, 0
		for _, n := range names {
			_, t := inTest[path]
			t = t && !skipRE.MatchString(n)
			_, f := inFault[path]
			f = f && runRE.MatchString(n)
			_, d := inDocker[path]
			d = d && dockerRE.MatchString(n)
			if f {
				faultNames[n] = true
			}
			if d {
				faultNames[n] = true
			}
			switch k := btoi(t) + btoi(f) + btoi(d); {
			case k > 1:
				problems = append(problems, fmt.Sprintf("%s %s: in more than one of make test, make test-fault and make test-docker", path, n))
			case k == 0:
				problems = append(problems, fmt.Sprintf("%s %s: in none of make test, make test-fault and make test-docker", path, n))
			case t:
				nTest++
			case f:
				nFault++
			default:
				nDocker++
			}
		}
		total += len(names)
		if len(names) > 0 {
			fmt.Printf("%-55s %4d in make test, %3d in make test-fault, %d in make test-docker\n", path, nTest, nFault, nDocker)
		}
	}
	// A name of the fault list that matches no test of a fault package is
	// stale (renamed or moved): say so rather than let the list rot.
	for _, l := range []struct{ flag, re, pkgs string }{{"-fault-run", faultRun, faultPkgs}, {"-docker-run", dockerRun, dockerPkgs}} {
		if alts, ok := alternatives(l.re); ok {
			for _, a := range alts {
				if !faultNames[a] {
					problems = append(problems, fmt.Sprintf("%s names %s, which is no test of %s", l.flag, a, l.pkgs))
				}
			}
		}
	}
	if len(problems) > 0 {
		return fmt.Errorf("%d problem(s):\n  %s", len(problems), strings.Join(problems, "\n  "))
	}
	fmt.Printf("ok: %d tests, each in exactly one of make test, make test-fault and make test-docker\n", total)
	return nil
}

// list runs go list on patterns: each package's import path, directory and
// test files (in-package and external), build constraints applied.
func list(patterns []string) (map[string]pkg, error) {
	out := map[string]pkg{}
	if len(patterns) == 0 {
		return out, nil
	}
	args := append([]string{"list", "-f", "{{.ImportPath}}\t{{.Dir}}\t{{join .TestGoFiles \" \"}} {{join .XTestGoFiles \" \"}}"}, patterns...)
	cmd := exec.Command("go", args...)
	cmd.Stderr = os.Stderr
	b, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go list %s: %w", strings.Join(patterns, " "), err)
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.SplitN(sc.Text(), "\t", 3)
		if len(f) != 3 {
			return nil, fmt.Errorf("go list: unexpected line %q", sc.Text())
		}
		out[f[0]] = pkg{path: f[0], dir: f[1], files: strings.Fields(f[2])}
	}
	return out, sc.Err()
}

// testFuncs lists the functions go test runs in p: TestXxx(*testing.T),
// FuzzXxx(*testing.F) (its seed corpus) and ExampleXxx (run when it has an
// output comment; listed either way, since -run and -skip select it too).
func testFuncs(p pkg) ([]string, error) {
	var names []string
	fset := token.NewFileSet()
	for _, f := range p.files {
		af, err := parser.ParseFile(fset, filepath.Join(p.dir, f), nil, parser.SkipObjectResolution)
		if err != nil {
			return nil, err
		}
		for _, d := range af.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Recv != nil {
				continue
			}
			n := fn.Name.Name
			switch {
			case isTest(n, "Test") && n != "TestMain" && paramIs(fn, "T"),
				isTest(n, "Fuzz") && paramIs(fn, "F"),
				isTest(n, "Example") && fn.Type.Params.NumFields() == 0:
				names = append(names, n)
			}
		}
	}
	return names, nil
}

// isTest is go test's rule: name is prefix followed by nothing or by a
// rune that is not a lower-case letter.
func isTest(name, prefix string) bool {
	if !strings.HasPrefix(name, prefix) {
		return false
	}
	if len(name) == len(prefix) {
		return true
	}
	r, _ := utf8.DecodeRuneInString(name[len(prefix):])
	return !unicode.IsLower(r)
}

// paramIs reports whether fn takes one parameter of type *testing.<typ>.
func paramIs(fn *ast.FuncDecl, typ string) bool {
	ps := fn.Type.Params.List
	if len(ps) != 1 || len(ps[0].Names) > 1 {
		return false
	}
	star, ok := ps[0].Type.(*ast.StarExpr)
	if !ok {
		return false
	}
	sel, ok := star.X.(*ast.SelectorExpr)
	return ok && sel.Sel.Name == typ
}

// alternatives splits a regexp of the form ^(A|B|C)$ into its literal
// names; ok is false for any other form.
func alternatives(re string) ([]string, bool) {
	if !strings.HasPrefix(re, "^(") || !strings.HasSuffix(re, ")$") {
		return nil, false
	}
	alts := strings.Split(re[2:len(re)-2], "|")
	for _, a := range alts {
		if a == "" || regexp.QuoteMeta(a) != a {
			return nil, false
		}
	}
	return alts, true
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}
