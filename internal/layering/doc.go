// Package layering checks Apiary's import graph against the rules written
// once, in docs/architecture.md ("Layering"), as a fenced block of `forbid`
// lines beside the picture of the allowed graph. Its test (run by `make
// test`) reads the graph of every package of the module, test files
// included, with golang.org/x/tools/go/packages and fails on every forbidden
// edge, naming the importing package, the imported one and the rule.
//
// It owns only the rule syntax and the check; it must not import any other
// package of ours.
package layering
