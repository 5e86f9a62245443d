package bench

import (
	"math"
	"slices"
	"strings"
	"testing"

	"apiary.dev/apiary/internal/jobspec"
)

func TestTwoStageJobIsValid(t *testing.T) {
	o := DefaultLocality
	spec := twoStageJob(o, 6)
	if err := jobspec.Validate(spec); err != nil {
		t.Fatalf("generated two-stage job is refused: %v", err)
	}
	g := spec.GetTasks()
	if len(g) != 2 || !slices.Equal(g[0].GetOutputs(), []string{"d7"}) || !slices.Equal(g[1].GetAfter(), []string{"produce"}) ||
		len(g[1].GetDatasets()) != 1 || g[1].GetDatasets()[0].GetName() != "d7" || g[1].GetCount() != o.Readers {
		t.Fatalf("two-stage job shape: %v", spec)
	}
	if !strings.Contains(g[1].GetArgs()[1], "APIARY_DATASET_D7") || !strings.Contains(g[0].GetArgs()[1], "head -c 4194304") {
		t.Fatalf("two-stage commands: %q / %q", g[0].GetArgs(), g[1].GetArgs())
	}
}

func TestTallyLocality(t *testing.T) {
	const mib = 1 << 20
	r := LocalityRun{Mode: LocalityOff, Producers: []string{"a", "b", "a"}, Tasks: []LocalityTask{
		{Node: "a", Holders: []string{"a"}, InputBytes: 4 * mib, FetchBytes: 0, SaidLocal: true},
		{Node: "b", Holders: []string{"a"}, InputBytes: 4 * mib, FetchBytes: 4 * mib},
		{Node: "c", Holders: []string{"b"}, InputBytes: 4 * mib, FetchBytes: 4 * mib},
		{Node: "b", Holders: []string{"b", "c"}, InputBytes: 4 * mib, FetchBytes: 0, SaidLocal: true},
	}}
	tallyLocality(&r)
	if r.Stage2 != 4 || r.InputBytes != 16*mib || r.FetchBytes != 8*mib || r.LocalFetch != 2 || r.LocalHolder != 2 || r.SaidLocal != 2 {
		t.Fatalf("tally %+v", r)
	}
	if f := r.Fraction(); math.Abs(f-0.5) > 1e-9 {
		t.Fatalf("fraction %v, want 0.5", f)
	}
	if (LocalityRun{}).Fraction() != 0 {
		t.Fatalf("fraction without input must be 0")
	}
	on := LocalityRun{Mode: LocalityOn, Producers: []string{"a", "b"}, Tasks: []LocalityTask{{Node: "a", Holders: []string{"a"}, InputBytes: 4 * mib}}}
	tallyLocality(&on)
	sums := SummarizeLocality([]LocalityRun{r, on, {Mode: LocalityOn, Err: "boom"}})
	if len(sums) != 2 || sums[0].Mode != LocalityOn || sums[0].N != 1 || sums[0].Errors != 1 || sums[0].Fraction != 0 {
		t.Fatalf("on summary %+v", sums)
	}
	if off := sums[1]; off.N != 1 || off.Fraction != 0.5 || off.MovedMiB.P50 != 8 || off.ProducerNodes.P50 != 2 {
		t.Fatalf("off summary %+v", off)
	}
}
