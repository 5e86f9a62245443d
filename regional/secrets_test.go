package regional_test

// Issue 19 item 6, secret environment values: a job's secret_env is sealed
// under the region's LAN gossip keyring in etcd, opened only for the agent
// that runs an attempt, redacted from every answer and log, compared (not
// hashed) on an idempotent repeat, re-sealed before `apiary keyring remove`
// takes its key away, and refused by a region that has no keyring.

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/devcluster"
	"apiary.dev/apiary/internal/secretbox"
	"apiary.dev/apiary/internal/testutil"
	"apiary.dev/apiary/regional/store"
)

// secretJob is a one-task job whose attempts write the DB_PASSWORD they see
// to <dir>/seen.<attempt>, wait for <dir>/go, then exit 3 (retryable) on
// attempt 1 and 0 after. The secret is given in env with secret: true.
func secretJob(dir, secret string) string {
	return fmt.Sprintf(`
name: secret
max_attempts: 3
tasks:
  - name: t
    command: sh
    args: ["-c", "printf %%s \"$DB_PASSWORD\" > %[1]s/seen.$APIARY_ATTEMPT.tmp && mv %[1]s/seen.$APIARY_ATTEMPT.tmp %[1]s/seen.$APIARY_ATTEMPT; while [ ! -e %[1]s/go ]; do sleep 0.05; done; test $APIARY_ATTEMPT != 1 || exit 3"]
    retryable_exit_codes: [3]
    env:
      PLAIN: visible
      DB_PASSWORD: {value: %[2]q, secret: true}
`, dir, secret)
}

// randomSecret is a value no log or key would hold by chance.
func randomSecret(t *testing.T) string {
	t.Helper()
	b := make([]byte, 12)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return "s3cret-" + hex.EncodeToString(b)
}

// waitSeen waits for <dir>/seen.<attempt> and returns what it holds.
func waitSeen(t *testing.T, dir string, attempt int) string {
	t.Helper()
	var got []byte
	testutil.Eventually(t, 30*time.Second, fmt.Sprintf("attempt %d ran", attempt), func() error {
		var err error
		got, err = os.ReadFile(filepath.Join(dir, fmt.Sprintf("seen.%d", attempt)))
		return err
	})
	return string(got)
}

// etcdValues reads every key of the region's etcd.
func etcdValues(t *testing.T, cli *clientv3.Client) map[string][]byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	resp, err := cli.Get(ctx, "", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]byte{}
	for _, kv := range resp.Kvs {
		out[string(kv.Key)] = kv.Value
	}
	return out
}

// jobRecordKV is the raw job record of id: its key, value and the
// DB_PASSWORD value stored in it.
func jobRecordKV(t *testing.T, cli *clientv3.Client, id string) (key string, raw []byte, stored string) {
	t.Helper()
	for k, v := range etcdValues(t, cli) {
		if strings.HasPrefix(k, store.PrefJobs) && strings.HasSuffix(k, "/"+id) {
			var rec struct {
				Spec struct {
					Tasks []struct {
						SecretEnv map[string]string `json:"secret_env"`
					} `json:"tasks"`
				} `json:"spec"`
			}
			if err := json.Unmarshal(v, &rec); err != nil || len(rec.Spec.Tasks) == 0 {
				t.Fatalf("job record %s: %v\n%s", k, err, v)
			}
			return k, v, rec.Spec.Tasks[0].SecretEnv["DB_PASSWORD"]
		}
	}
	t.Fatalf("no job record for %s", id)
	return "", nil, ""
}

// putRaw writes a key of the region's etcd.
func putRaw(t *testing.T, cli *clientv3.Client, key string, value []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	if _, err := cli.Put(ctx, key, string(value)); err != nil {
		t.Fatal(err)
	}
}

// noPlaintext fails the test when the secret is in any etcd value or in any
// file under dir (etcd's WAL and database, the keyring files, every
// process's log and data directory).
func noPlaintext(t *testing.T, what string, cli *clientv3.Client, dir, secret string) {
	t.Helper()
	for k, v := range etcdValues(t, cli) {
		if bytes.Contains(v, []byte(secret)) {
			t.Fatalf("%s: etcd key %s holds the secret in clear", what, k)
		}
	}
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !d.Type().IsRegular() {
			return nil
		}
		b, err := os.ReadFile(path)
		if err == nil && bytes.Contains(b, []byte(secret)) {
			t.Errorf("%s: %s holds the secret in clear", what, path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if t.Failed() {
		t.FailNow()
	}
}

// checkRedacted fails unless the job's spec shows DB_PASSWORD as
// "<redacted>", keeps its plain env, and holds the secret nowhere.
func checkRedacted(t *testing.T, what string, j *apiaryv1.Job, secret string) {
	t.Helper()
	g := j.GetSpec().GetTasks()[0]
	if g.GetSecretEnv()["DB_PASSWORD"] != "<redacted>" || len(g.GetSecretEnv()) != 1 || g.GetEnv()["PLAIN"] != "visible" {
		t.Fatalf("%s: env %v, secret_env %v; want DB_PASSWORD <redacted>", what, g.GetEnv(), g.GetSecretEnv())
	}
	if b, _ := protojson.Marshal(j); bytes.Contains(b, []byte(secret)) {
		t.Fatalf("%s: the answer holds the secret", what)
	}
}

// setEligible turns both nodes' eligibility on or off.
func setEligible(t *testing.T, c clients, on bool) {
	t.Helper()
	for _, n := range []string{"n1", "n2"} {
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		_, err := c.admin.SetNodeEligibility(ctx, &apiaryv1.SetNodeEligibilityRequest{NodeId: n, Eligible: on, By: "test"})
		cancel()
		if err != nil {
			t.Fatal(err)
		}
	}
}

// TestSecretEnvEndToEnd, one coordinator with a gossip key, two agents, a
// router (real processes):
//   - a job with a secret runs and its process sees the value; while it
//     runs, neither etcd (every key, and its files on disk) nor any log
//     holds the value; the stored assignment carries no value either;
//   - GetJob, ListJobs, WatchJob (region and router) and `job status`
//     (text and JSON) show "<redacted>";
//   - the same request again is deduplicated (region and router); the same
//     ids with another secret value are ALREADY_EXISTS;
//   - `keyring install` and `use` leave the record as it is; `remove` of
//     the old key is refused (naming how many jobs) while a value under it
//     cannot be re-sealed, then re-seals the job under the new key and
//     succeeds; the job's next attempt still gets the secret;
//   - a value sealed under a key the region does not hold fails its
//     dispatch with an error on the task naming the key, and never runs.
func TestSecretEnvEndToEnd(t *testing.T) {
	oldKey, oldRaw := mustKey(t)
	dir := t.TempDir()
	cl, r, _ := gossipCluster(t, dir, false, oldKey)
	c := dial(t, r)
	cli := etcdOf(t, cl, r)
	if err := r.WaitNodes(t.Context(), 2); err != nil {
		t.Fatal(err)
	}
	secret := randomSecret(t)
	gate := t.TempDir()
	js := spec(t, secretJob(gate, secret))
	req := &apiaryv1.SubmitJobRequest{Spec: js, ClientId: "secret-test", RequestId: "r-1"}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	resp, err := c.jobs.SubmitJob(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	id := resp.GetJobId()
	if got := waitSeen(t, gate, 1); got != secret {
		t.Fatalf("attempt 1 saw DB_PASSWORD=%q, want the secret", got)
	}
	waitAttemptRunning(t, c, id, 0, 1, 10*time.Second)

	// At rest: sealed under the old key, nowhere in clear.
	jobKey, original, stored := jobRecordKV(t, cli, id)
	if kid, ok := secretbox.KeyIDOf(stored); !ok || kid != secretbox.KeyID(oldRaw) {
		t.Fatalf("stored DB_PASSWORD %q: want a value sealed under key %s", stored, secretbox.KeyID(oldRaw))
	}
	var assigns int
	for k, v := range etcdValues(t, cli) {
		if strings.HasPrefix(k, store.PrefAssign) && strings.Contains(k, id) {
			assigns++
			if !bytes.Contains(v, []byte(store.SecretEnvMarker)) || bytes.Contains(v, []byte("apiary-sealed:")) {
				t.Fatalf("stored assignment %s: want the marker and no sealed value: %q", k, v)
			}
		}
	}
	if assigns != 1 {
		t.Fatalf("%d stored assignments of the running job, want 1", assigns)
	}
	noPlaintext(t, "while the job runs", cli, dir, secret)

	// Every answer redacts.
	j, err := getJob(c, id)
	if err != nil {
		t.Fatal(err)
	}
	checkRedacted(t, "GetJob", j, secret)
	lctx, lcancel := context.WithTimeout(t.Context(), 5*time.Second)
	list, err := c.jobs.ListJobs(lctx, &apiaryv1.ListJobsRequest{})
	lcancel()
	if err != nil || len(list.GetJobs()) != 1 {
		t.Fatalf("ListJobs: %v, %d jobs", err, len(list.GetJobs()))
	}
	checkRedacted(t, "ListJobs", list.GetJobs()[0], secret)
	wctx, wcancel := context.WithTimeout(t.Context(), 5*time.Second)
	w, err := c.jobs.WatchJob(wctx, &apiaryv1.WatchJobRequest{JobId: id})
	if err != nil {
		t.Fatal(err)
	}
	first, err := w.Recv()
	wcancel()
	if err != nil {
		t.Fatal(err)
	}
	checkRedacted(t, "WatchJob", first.GetJob(), secret)
	rconn, err := cl.Dial(cl.GlobalAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer rconn.Close()
	router := apiaryv1.NewJobServiceClient(rconn)
	gctx, gcancel := context.WithTimeout(t.Context(), 5*time.Second)
	rj, err := router.GetJob(gctx, &apiaryv1.GetJobRequest{JobId: id})
	gcancel()
	if err != nil {
		t.Fatal(err)
	}
	checkRedacted(t, "GetJob through the router", rj.GetJob(), secret)
	for _, args := range [][]string{{"job", "status", id, "--addr", r.Addr()}, {"job", "status", id, "-o", "json", "--addr", r.Addr()}} {
		res := runBin(t, nil, args...)
		if res.code != 0 || !strings.Contains(res.stdout, "DB_PASSWORD") || !strings.Contains(res.stdout, "<redacted>") ||
			strings.Contains(res.stdout+res.stderr, secret) {
			t.Fatalf("apiary %v: exit %d; want DB_PASSWORD <redacted> and no secret:\n%s\n%s", args, res.code, res.stdout, res.stderr)
		}
	}

	// Dedup: the same request is the same job; another secret under the
	// same ids is another payload, through the region and the router.
	for _, via := range []struct {
		name string
		jobs apiaryv1.JobServiceClient
	}{{"region", c.jobs}, {"router", router}} {
		again, err := via.jobs.SubmitJob(ctx, req)
		if err != nil || again.GetJobId() != id || !again.GetDeduplicated() {
			t.Fatalf("%s: the same request again: %v, %v; want job %s deduplicated", via.name, again, err, id)
		}
		other := spec(t, secretJob(gate, secret+"-other"))
		_, err = via.jobs.SubmitJob(ctx, &apiaryv1.SubmitJobRequest{Spec: other, ClientId: "secret-test", RequestId: "r-1"})
		if status.Code(err) != codes.AlreadyExists || !strings.Contains(err.Error(), "different payload") || strings.Contains(err.Error(), secret) {
			t.Fatalf("%s: the same ids with another secret: %v; want ALREADY_EXISTS", via.name, err)
		}
	}

	// Rotation. install and use leave the stored value alone.
	newKey, newRaw := mustKey(t)
	keyring(t, nil, r.Addr(), "install", newKey)
	keyring(t, nil, r.Addr(), "use", newKey)
	if _, _, now := jobRecordKV(t, cli, id); now != stored {
		t.Fatal("install/use rewrote the stored secret")
	}
	// A value under the old key that does not open: the removal is
	// refused, nothing is removed.
	tampered := bytes.Replace(original, []byte(stored), []byte(tamper(stored)), 1)
	putRaw(t, cli, jobKey, tampered)
	res := runBin(t, nil, "keyring", "remove", oldKey, "--pool", "lan", "--addr", r.Addr())
	if res.code == 0 || !strings.Contains(res.stderr, "1 jobs still hold secret_env sealed under it") || !strings.Contains(res.stderr, secretbox.KeyID(oldRaw)) {
		t.Fatalf("remove with a value that cannot be re-sealed: exit %d\n%s\n%s", res.code, res.stdout, res.stderr)
	}
	if l := keyring(t, nil, r.Addr(), "list", "--pool", "lan"); len(l.GetPools()[0].GetKeys()) != 2 {
		t.Fatalf("after the refused removal the LAN pool holds %v", l.GetPools()[0].GetKeys())
	}
	putRaw(t, cli, jobKey, original)
	keyring(t, nil, r.Addr(), "remove", oldKey)
	_, _, resealedValue := jobRecordKV(t, cli, id)
	if kid, _ := secretbox.KeyIDOf(resealedValue); kid != secretbox.KeyID(newRaw) {
		t.Fatalf("after the removal DB_PASSWORD is sealed under %q, want the new key %s", kid, secretbox.KeyID(newRaw))
	}
	for k, v := range etcdValues(t, cli) {
		if bytes.Contains(v, []byte(secretbox.Prefix+secretbox.KeyID(oldRaw))) {
			t.Fatalf("etcd key %s still holds a value sealed under the removed key", k)
		}
	}
	// The next attempt opens the re-sealed value.
	openGate(t, gate)
	if got := waitSeen(t, gate, 2); got != secret {
		t.Fatalf("attempt 2, after the rotation, saw DB_PASSWORD=%q, want the secret", got)
	}
	waitState(t, c, id, apiaryv1.JobState_JOB_STATE_COMPLETE, 30*time.Second)

	// A value sealed under a key this region does not hold fails its
	// dispatch: an error on the task, never a run with an empty value.
	setEligible(t, c, false)
	lost := t.TempDir()
	lid := submit(t, c, spec(t, secretJob(lost, secret)))
	lkey, lraw, lstored := jobRecordKV(t, cli, lid)
	_, foreign := mustKey(t)
	resealed, err := secretbox.Seal(foreign, []byte(secret), nil)
	if err != nil {
		t.Fatal(err)
	}
	putRaw(t, cli, lkey, bytes.Replace(lraw, []byte(lstored), []byte(resealed), 1))
	setEligible(t, c, true)
	failed := waitState(t, c, lid, apiaryv1.JobState_JOB_STATE_FAILED, 30*time.Second)
	terr := failed.GetTasks()[0].GetError()
	if !strings.Contains(terr, "dispatch: secret_env DB_PASSWORD of tasks[0]") || !strings.Contains(terr, secretbox.KeyID(foreign)) ||
		!strings.Contains(terr, "not in the keyring") {
		t.Fatalf("task error %q: want the dispatch failure naming the variable and key %s", terr, secretbox.KeyID(foreign))
	}
	if _, err := os.Stat(filepath.Join(lost, "seen.1")); !os.IsNotExist(err) {
		t.Fatalf("the attempt whose secret could not be opened ran anyway (%v)", err)
	}

	// No log (coordinator, agents, router) and no file holds the value.
	noPlaintext(t, "at the end", cli, dir, secret)
}

// tamper changes one character in the middle of a sealed value's body.
func tamper(sealed string) string {
	b := []byte(sealed)
	i := len(b) / 2
	if b[i] == 'A' {
		b[i] = 'B'
	} else {
		b[i] = 'A'
	}
	return string(b)
}

// TestSecretEnvNeedsAKeyring: a region whose coordinators have no gossip
// key refuses a job with secret_env (FAILED_PRECONDITION naming
// secret_env and --gossip-key; the CLI exits 2 and nothing is stored) and
// still takes one without.
func TestSecretEnvNeedsAKeyring(t *testing.T) {
	_, r := cluster(t, devcluster.RegionSpec{})
	c := dial(t, r)
	secret := randomSecret(t)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	s := spec(t, "name: s\ntasks:\n  - name: t\n    command: \"true\"\n    secret_env: {TOKEN: "+secret+"}\n")
	var err error
	testutil.Eventually(t, 20*time.Second, "an answer", func() error {
		_, err = c.jobs.SubmitJob(ctx, &apiaryv1.SubmitJobRequest{Spec: s})
		if status.Code(err) == codes.Unavailable {
			return err
		}
		return nil
	})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "secret_env") || !strings.Contains(err.Error(), "--gossip-key") ||
		strings.Contains(err.Error(), secret) {
		t.Fatalf("secret_env without a keyring: %v; want FAILED_PRECONDITION naming secret_env and --gossip-key", err)
	}
	file := filepath.Join(t.TempDir(), "job.yaml")
	if err := os.WriteFile(file, []byte("name: s\ntasks:\n  - name: t\n    command: \"true\"\n    env:\n      TOKEN: {value: "+secret+", secret: true}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	res := runBin(t, nil, "job", "run", file, "--addr", r.Addr())
	if res.code != 2 || !strings.Contains(res.stderr, "secret_env") || !strings.Contains(res.stderr, "--gossip-key") {
		t.Fatalf("job run: exit %d, want 2 naming secret_env and --gossip-key\n%s", res.code, res.stderr)
	}
	list, err := c.jobs.ListJobs(ctx, &apiaryv1.ListJobsRequest{})
	if err != nil || len(list.GetJobs()) != 0 {
		t.Fatalf("ListJobs after the refusals: %v, %d jobs", err, len(list.GetJobs()))
	}
	if _, err := c.jobs.SubmitJob(ctx, &apiaryv1.SubmitJobRequest{Spec: spec(t, "name: p\ntasks:\n  - name: t\n    command: \"true\"\n")}); err != nil {
		t.Fatalf("a job without secrets: %v", err)
	}
}
