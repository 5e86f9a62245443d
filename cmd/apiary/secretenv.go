package main

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/jobspec"
)

// printSecretEnv writes one "Secret env:" line per task group that has
// secret_env: the group and each variable's name with "<redacted>". It
// prints the names only, whatever value the server sent (a region redacts
// them; an older one might not).
func printSecretEnv(w io.Writer, spec *apiaryv1.JobSpec) {
	for i, g := range spec.GetTasks() {
		if len(g.GetSecretEnv()) == 0 {
			continue
		}
		var vars []string
		for _, k := range slices.Sorted(maps.Keys(g.GetSecretEnv())) {
			vars = append(vars, cell(k, 64)+"="+jobspec.Redacted)
		}
		name := g.GetName()
		if name == "" {
			name = fmt.Sprintf("tasks[%d]", i)
		}
		fmt.Fprintf(w, "Secret env:\t%s: %s\n", cell(name, 24), strings.Join(vars, " "))
	}
}
