package regional_test

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"apiary.dev/apiary/internal/devcluster"
	"apiary.dev/apiary/internal/testutil"
)

// TestQuorumLossIsLogged: when two of three members die, the survivor keeps
// running (it cannot serve, and it does not know whether the others come
// back), but it says so once in its log instead of nothing.
func TestQuorumLossIsLogged(t *testing.T) {
	_, r := cluster(t, devcluster.RegionSpec{Coordinators: 3})
	for _, i := range []int{1, 2} {
		if err := r.Coords[i].Kill(); err != nil {
			t.Fatal(err)
		}
	}
	survivor := r.Coords[0]
	testutil.Eventually(t, 20*time.Second, "the survivor logs that etcd answers no reads", func() error {
		b, err := os.ReadFile(survivor.LogPath)
		if err != nil {
			return err
		}
		if !strings.Contains(string(b), "the region's etcd answers no reads") {
			return fmt.Errorf("not logged yet")
		}
		return nil
	})
	if !survivor.Running() {
		t.Fatal("the survivor exited; it should wait for its peers")
	}
}
