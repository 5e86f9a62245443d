package regional_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/devcluster"
	"apiary.dev/apiary/internal/testutil"
	"apiary.dev/apiary/regional/store"
)

// TestRetentionDeletesFinishedJobs: a finished job is deleted whole (record,
// tasks, results, dedup key) after the retention period; a running one is not.
func TestRetentionDeletesFinishedJobs(t *testing.T) {
	_, r := cluster(t, devcluster.RegionSpec{Agents: twoAgents(), ExtraArgs: []string{"--job-retention", "1s"}})
	c := dial(t, r)
	done := submit(t, c, spec(t, "name: quick\ntasks:\n  - name: a\n    count: 3\n    command: \"true\"\n"))
	waitState(t, c, done, apiaryv1.JobState_JOB_STATE_COMPLETE, 20*time.Second)
	running := submit(t, c, spec(t, "name: slow\ntasks:\n  - name: a\n    command: sleep\n    args: [\"30\"]\n"))
	testutil.Eventually(t, 30*time.Second, "finished job deleted", func() error {
		_, err := getJob(c, done)
		if status.Code(err) == codes.NotFound {
			return nil
		}
		return fmt.Errorf("GetJob: %v", err)
	})
	cli, err := clientv3.New(clientv3.Config{Endpoints: r.EtcdEndpoints, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, prefix := range []string{store.PrefJobs, store.PrefTasks, store.PrefResults, store.PrefDedup} {
		resp, err := cli.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithKeysOnly())
		if err != nil {
			t.Fatal(err)
		}
		for _, kv := range resp.Kvs {
			if strings.Contains(string(kv.Key), done) {
				t.Fatalf("key %s of a deleted job remains", kv.Key)
			}
		}
	}
	if j, err := getJob(c, running); err != nil || j.GetState() == apiaryv1.JobState_JOB_STATE_COMPLETE {
		t.Fatalf("running job: %v %v", j.GetState(), err)
	}
}
