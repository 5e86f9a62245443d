package regional

import (
	"bytes"
	"context"
	"crypto/subtle"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/jobspec"
	"apiary.dev/apiary/internal/secretbox"
	"apiary.dev/apiary/regional/store"
	"apiary.dev/apiary/shards"
)

// Secret environment values (TaskGroup.secret_env; issue 19 item 6), after
// Nomad's and Vault's keyrings:
//
//   - Submit: the values are sealed (internal/secretbox, AES-256-GCM) under
//     the primary key of this coordinator's serf LAN keyring before the job
//     record is written, bound to (job id, group, name); the record in etcd
//     holds only sealed values. A region without a LAN keyring refuses
//     secret_env (FAILED_PRECONDITION).
//   - Dispatch: a planned assignment (/apiary/assign/...) carries no secret,
//     only store.SecretEnvMarker (the group index) in its env. The coordinator
//     that streams it to the node's agent reads the job record, opens the
//     group's values with any key of its keyring and sends them in
//     Assignment.env over that stream (mTLS), nowhere else. A value it
//     cannot open (its key was removed, or the record was tampered with)
//     fails that attempt's dispatch: a START_FAILED report (job fault) whose
//     error names the variable and the key id, never an empty value.
//   - Answers: every job rendered for a client (GetJob, ListJobs, WatchJob,
//     CancelJob) shows each value as "<redacted>" (jobspec.Redact).
//   - Dedup: jobspec.PayloadHash leaves secret values out; a repeat whose
//     hash matches is compared here, value by value (sameSecrets).
//   - Rotation: `apiary keyring remove` (LAN pool) first re-seals every
//     value under the removed key with the primary key (resealSecrets), and
//     is refused while any job still depends on it.

// secretAAD binds a sealed value to its job, group and name, so that a
// value copied to another job or variable in etcd does not open.
func secretAAD(jobID string, group int, name string) []byte {
	return []byte("apiary secret_env job=" + jobID + " group=" + strconv.Itoa(group) + " name=" + name)
}

// sealKeys is the keyring secrets use: the primary key seals, every key
// (primary first) opens.
type sealKeys struct {
	primary []byte
	all     [][]byte
}

// errNoKeyring: this coordinator has no LAN keyring to seal or open with.
var errNoKeyring = errors.New("no keyring")

// secretKeys returns this coordinator's LAN keyring, or errNoKeyring when
// its LAN pool gossips in plain text or does not run.
func (c *Coordinator) secretKeys() (sealKeys, error) {
	c.lan.mu.Lock()
	kr := c.lan.keyring
	c.lan.mu.Unlock()
	if kr == nil {
		return sealKeys{}, errNoKeyring
	}
	all := kr.GetKeys() // primary first; a new slice after every change
	if len(all) == 0 {
		return sealKeys{}, errNoKeyring
	}
	return sealKeys{primary: all[0], all: all}, nil
}

// lanStarting reports whether the LAN member is configured but has not
// started yet (the api part starts before the lan part).
func (c *Coordinator) lanStarting() bool {
	c.lan.mu.Lock()
	defer c.lan.mu.Unlock()
	return c.cfg.LANAddr != "" && c.lan.serf == nil && c.lan.keyring == nil
}

// submitKeys returns the keys a submission with secret_env is sealed with,
// or its refusal: FAILED_PRECONDITION when this coordinator has no LAN
// keyring (naming secret_env and --gossip-key), UNAVAILABLE while its LAN
// member is still starting.
func (c *Coordinator) submitKeys() (sealKeys, error) {
	k, err := c.secretKeys()
	switch {
	case err == nil:
		return k, nil
	case c.lanStarting():
		return sealKeys{}, status.Error(codes.Unavailable, "secret_env: this coordinator's LAN member, whose keyring seals secrets, is starting; retry")
	}
	return sealKeys{}, status.Errorf(codes.FailedPrecondition, "secret_env: region %s cannot store secrets: its coordinators have no gossip keyring to seal them with; "+
		"start them with --gossip-key (apiary keygen) and --lan-addr, or submit the job to a region that has one", c.meta.Region)
}

// sealSpec returns a copy of spec with every secret_env value sealed under
// primary for job jobID.
func sealSpec(spec *apiaryv1.JobSpec, jobID string, primary []byte) (*apiaryv1.JobSpec, error) {
	return jobspec.MapSecrets(spec, func(g int, name, v string) (string, error) {
		return secretbox.Seal(primary, []byte(v), secretAAD(jobID, g, name))
	})
}

// openGroupSecrets opens the secret_env values of task group g of a stored
// job record with keys. Errors name the variable and, for a removed key,
// its id; they never hold a value.
func openGroupSecrets(rec *store.JobRecord, g int, keys [][]byte) (map[string]string, error) {
	groups := rec.Spec.GetTasks()
	if g < 0 || g >= len(groups) {
		return nil, fmt.Errorf("job %s has no task group %d", rec.ID, g)
	}
	sec := groups[g].GetSecretEnv()
	out := make(map[string]string, len(sec))
	for name, sealed := range sec {
		pt, err := secretbox.Open(keys, sealed, secretAAD(rec.ID, g, name))
		if err != nil {
			return nil, fmt.Errorf("secret_env %s of tasks[%d]: %w", name, g, err)
		}
		out[name] = string(pt)
	}
	return out, nil
}

// readJobRecord reads one job record from etcd (nil, nil when it is gone).
func (c *Coordinator) readJobRecord(ctx context.Context, jobID string) (*store.JobRecord, error) {
	gctx, cancel := store.EtcdCtx(ctx)
	defer cancel()
	resp, err := c.cli.Get(gctx, store.KeyJob(shards.Of(jobID, c.meta.ShardCount), jobID))
	if err != nil {
		return nil, err
	}
	if len(resp.Kvs) == 0 {
		return nil, nil
	}
	var rec store.JobRecord
	if err := json.Unmarshal(resp.Kvs[0].Value, &rec); err != nil {
		return nil, fmt.Errorf("decode job %s: %w", jobID, err)
	}
	return &rec, nil
}

// sameSecrets reports whether the stored job jobID holds exactly the
// secret_env values of plain (whose names the payload hash already
// matched): each group's values opened and compared in constant time. An
// error means they could not be compared (the job is gone, or a value does
// not open).
func (c *Coordinator) sameSecrets(ctx context.Context, jobID string, plain *apiaryv1.JobSpec) (bool, error) {
	rec, err := c.readJobRecord(ctx, jobID)
	if err != nil {
		return false, err
	}
	if rec == nil {
		return false, fmt.Errorf("job %s is gone", jobID)
	}
	keys, err := c.secretKeys()
	if err != nil {
		return false, err
	}
	if len(rec.Spec.GetTasks()) != len(plain.GetTasks()) {
		return false, nil
	}
	same := true
	for g, grp := range plain.GetTasks() {
		stored, err := openGroupSecrets(rec, g, keys.all)
		if err != nil {
			return false, err
		}
		if len(stored) != len(grp.GetSecretEnv()) {
			same = false
		}
		for name, v := range grp.GetSecretEnv() {
			sv, ok := stored[name]
			if !ok || subtle.ConstantTimeCompare([]byte(sv), []byte(v)) != 1 {
				same = false
			}
		}
	}
	return same, nil
}

// checkRepeatSecrets turns a deduplicated answer for a spec with secret_env
// into ALREADY_EXISTS when the stored job's values differ (or cannot be
// compared: then the repeat is not taken for the same request, which never
// makes a second job).
func (c *Coordinator) checkRepeatSecrets(ctx context.Context, jobID, clientID, requestID string, plain *apiaryv1.JobSpec) error {
	same, err := c.sameSecrets(ctx, jobID, plain)
	if err != nil {
		return status.Errorf(codes.AlreadyExists, "request_id: %q of client %q was already used for job %s, whose secret_env could not be compared with this request's (%v); "+
			"use another request id", requestID, clientID, jobID, err)
	}
	if !same {
		return status.Errorf(codes.AlreadyExists, "request_id: %q of client %q was already used for job %s with a different payload", requestID, clientID, jobID)
	}
	return nil
}

// errDispatchRetry marks an assignment whose secrets could not be resolved
// for a passing reason (etcd unavailable, the LAN member not started yet):
// the stream ends and the agent reconnects, nothing is failed.
var errDispatchRetry = errors.New("retry dispatch")

// withSecrets replaces an assignment's store.SecretEnvMarker by the opened
// secret_env values of its group, read from the job record now (so a
// re-sealed record is seen). An error wrapping errDispatchRetry is passing;
// any other means the attempt cannot get its secrets (failDispatch).
func (c *Coordinator) withSecrets(ctx context.Context, a *apiaryv1.Assignment) error {
	mark, ok := a.GetEnv()[store.SecretEnvMarker]
	if !ok {
		return nil
	}
	delete(a.Env, store.SecretEnvMarker)
	g, err := strconv.Atoi(mark)
	if err != nil {
		return fmt.Errorf("assignment of %s/%d: bad %s %q", a.GetJobId(), a.GetTaskIndex(), store.SecretEnvMarker, mark)
	}
	keys, err := c.secretKeys()
	if err != nil {
		if c.lanStarting() {
			return fmt.Errorf("%w: the LAN member is starting", errDispatchRetry)
		}
		return fmt.Errorf("secret_env of tasks[%d]: coordinator %s has no gossip keyring to open it with (start it with --gossip-key)", g, c.cfg.ID)
	}
	rec, err := c.readJobRecord(ctx, a.GetJobId())
	if err != nil {
		return fmt.Errorf("%w: read job %s: %v", errDispatchRetry, a.GetJobId(), err)
	}
	if rec == nil {
		return fmt.Errorf("job %s is gone", a.GetJobId())
	}
	sec, err := openGroupSecrets(rec, g, keys.all)
	if err != nil {
		var uk *secretbox.UnknownKeyError
		if errors.As(err, &uk) {
			return fmt.Errorf("%w; coordinator %s's keyring holds %d keys, none with that id: the key was removed from the LAN keyring "+
				"(apiary keyring install it again, or submit the job again)", err, c.cfg.ID, len(keys.all))
		}
		return err
	}
	if a.Env == nil {
		a.Env = make(map[string]string, len(sec))
	}
	for k, v := range sec {
		a.Env[k] = v
	}
	return nil
}

// failDispatch commits the failure of an attempt whose secrets could not be
// opened, as a START_FAILED report of the job's fault carrying the reason
// (never a value), through the report path (fenced on the attempt and the
// node epoch). It runs in the background and logs its outcome.
func (c *Coordinator) failDispatch(nodeID string, a *apiaryv1.Assignment, why error) {
	now := time.Now().UnixMilli()
	req := &apiaryv1.ReportTaskStatusRequest{NodeId: nodeID, NodeEpoch: a.GetNodeEpoch(), JobId: a.GetJobId(),
		TaskIndex: a.GetTaskIndex(), Attempt: a.GetAttempt(), Kind: apiaryv1.ReportKind_REPORT_KIND_START_FAILED,
		Error: "dispatch: " + why.Error(), StartTimeMs: now, EndTimeMs: now, Fault: apiaryv1.FailureFault_FAILURE_FAULT_JOB}
	c.log.Warn("assignment not dispatched: its secrets cannot be opened", "job", a.GetJobId(), "task", a.GetTaskIndex(),
		"attempt", a.GetAttempt(), "node", nodeID, "err", why)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), commitAttempts*commitAttemptTimeout)
		defer cancel()
		it := &reportItem{req: req, done: make(chan *apiaryv1.ReportTaskStatusResponse, 1)}
		if err := c.reports.submit(ctx, it); err != nil {
			c.log.Warn("dispatch failure not recorded", "job", a.GetJobId(), "task", a.GetTaskIndex(), "err", err)
			return
		}
		select {
		case r := <-it.done:
			if it.err != nil || !r.GetAccepted() {
				c.log.Warn("dispatch failure not recorded", "job", a.GetJobId(), "task", a.GetTaskIndex(), "err", it.err, "reason", r.GetReason())
			}
		case <-ctx.Done():
		}
	}()
}

// Re-sealing before a key leaves the LAN keyring.
const (
	// resealPage is how many job records one range read returns.
	resealPage = 64
	// resealBatchBytes bounds the values one re-seal Txn writes.
	resealBatchBytes = 2 << 20
	// resealTries is how often one record is re-read and written again
	// after its compare failed.
	resealTries = 5
	// resealPasses is how many scans of the jobs resealSecrets makes
	// before it gives up on values still sealed under the key.
	resealPasses = 3
)

// resealed is one job record re-sealed in memory: its key, the
// ModRevision it was read at, and the new value.
type resealed struct {
	key    string
	modRev int64
	value  string
}

// resealRecord re-seals, in a copy of rec's spec, every secret_env value
// sealed under the key with id oldID with k's primary key; n is how many
// values changed (0: rec is returned unchanged).
func resealRecord(rec *store.JobRecord, oldID string, k sealKeys) (out *store.JobRecord, n int, err error) {
	spec, err := jobspec.MapSecrets(rec.Spec, func(g int, name, v string) (string, error) {
		if id, ok := secretbox.KeyIDOf(v); !ok || id != oldID {
			return v, nil
		}
		aad := secretAAD(rec.ID, g, name)
		pt, err := secretbox.Open(k.all, v, aad)
		if err != nil {
			return "", err
		}
		n++
		return secretbox.Seal(k.primary, pt, aad)
	})
	if err != nil || n == 0 {
		return rec, 0, err
	}
	cp := *rec
	cp.Spec = spec
	return &cp, n, nil
}

// usesKey reports whether some secret_env value of rec is sealed under the
// key with id oldID.
func usesKey(rec *store.JobRecord, oldID string) bool {
	for _, g := range rec.Spec.GetTasks() {
		for _, v := range g.GetSecretEnv() {
			if id, ok := secretbox.KeyIDOf(v); ok && id == oldID {
				return true
			}
		}
	}
	return false
}

// resealSecrets makes sure no stored secret depends on the LAN key
// oldKey (standard base64) before it is removed: it scans every job record
// in pages, re-seals the values sealed under it with the primary key, and
// writes them in bounded Txns, each comparing every record's ModRevision (a
// record changed meanwhile is re-read and re-sealed alone, up to
// resealTries times). It scans again until a pass finds nothing to do
// (at most resealPasses). It returns how many jobs it re-sealed, or a
// status: FAILED_PRECONDITION naming how many jobs still use the key,
// UNAVAILABLE when etcd failed. Removing the primary key is left to serf,
// which refuses it.
func (c *Coordinator) resealSecrets(ctx context.Context, oldKey string) (int, error) {
	raw, err := base64.StdEncoding.DecodeString(oldKey)
	if err != nil {
		return 0, status.Errorf(codes.InvalidArgument, "key: %v", err)
	}
	k, err := c.secretKeys()
	if err != nil || bytes.Equal(k.primary, raw) {
		return 0, nil
	}
	oldID := secretbox.KeyID(raw)
	total, left := 0, 0
	for pass := 0; pass < resealPasses; pass++ {
		n, l, found, err := c.resealPass(ctx, oldID, k)
		total += n
		if err != nil {
			return total, status.Errorf(codes.Unavailable, "re-seal secrets before removing key %s: %v", oldID, err)
		}
		left = l
		if found == 0 {
			break
		}
	}
	if left > 0 {
		return total, status.Errorf(codes.FailedPrecondition, "key %s not removed: %d jobs still hold secret_env sealed under it after re-sealing "+
			"(their records kept changing, or a coordinator still seals with it: check `apiary keyring list`); retry the removal", oldID, left)
	}
	if total > 0 {
		c.log.Info("secrets re-sealed before a key removal", "key", oldID, "primary", secretbox.KeyID(k.primary), "jobs", total)
	}
	return total, nil
}

// resealPass is one scan of every job record: n jobs re-sealed, left
// jobs that still use oldID after it (their writes kept conflicting or
// failed to open), found jobs that used it when read.
func (c *Coordinator) resealPass(ctx context.Context, oldID string, k sealKeys) (n, left, found int, err error) {
	end := clientv3.GetPrefixRangeEnd(store.PrefJobs)
	from := store.PrefJobs
	for {
		gctx, cancel := store.EtcdCtx(ctx)
		resp, err := c.cli.Get(gctx, from, clientv3.WithRange(end), clientv3.WithLimit(resealPage))
		cancel()
		if err != nil {
			return n, left, found, err
		}
		var batch []resealed
		size := 0
		flush := func() error {
			if len(batch) == 0 {
				return nil
			}
			m, l, err := c.writeResealed(ctx, batch, oldID, k)
			n, left = n+m, left+l
			batch, size = nil, 0
			return err
		}
		for _, kv := range resp.Kvs {
			var rec store.JobRecord
			if json.Unmarshal(kv.Value, &rec) != nil || !usesKey(&rec, oldID) {
				continue
			}
			found++
			nr, m, err := resealRecord(&rec, oldID, k)
			if err != nil {
				c.log.Warn("a secret cannot be re-sealed", "job", rec.ID, "key", oldID, "err", err)
				left++
				continue
			}
			if m == 0 {
				continue
			}
			v := store.MustJSON(nr)
			batch = append(batch, resealed{key: string(kv.Key), modRev: kv.ModRevision, value: v})
			size += len(v)
			if size >= resealBatchBytes {
				if err := flush(); err != nil {
					return n, left, found, err
				}
			}
		}
		if err := flush(); err != nil {
			return n, left, found, err
		}
		if !resp.More || len(resp.Kvs) == 0 {
			return n, left, found, nil
		}
		from = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
}

// writeResealed writes a batch of re-sealed records in one Txn comparing
// each record's ModRevision; when a compare fails, each record is re-read,
// re-sealed and written alone (resealTries times). It returns how many
// records it re-sealed and how many still use oldID.
func (c *Coordinator) writeResealed(ctx context.Context, batch []resealed, oldID string, k sealKeys) (n, left int, err error) {
	var cmps []clientv3.Cmp
	var ops []clientv3.Op
	for _, r := range batch {
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(r.key), "=", r.modRev))
		ops = append(ops, clientv3.OpPut(r.key, r.value))
	}
	resp, err := c.txnRetry(ctx, func(actx context.Context) (*clientv3.TxnResponse, error) {
		return c.cli.Txn(actx).If(cmps...).Then(ops...).Commit()
	})
	if err != nil {
		return 0, 0, err
	}
	if resp.Succeeded {
		return len(batch), 0, nil
	}
	for _, r := range batch {
		ok, err := c.resealOne(ctx, r.key, oldID, k)
		if err != nil {
			return n, left, err
		}
		if ok {
			n++
		} else {
			left++
		}
	}
	return n, left, nil
}

// resealOne re-reads one job record and re-seals it alone, compared on its
// ModRevision, retrying a failed compare; ok is false when it still uses
// oldID after resealTries.
func (c *Coordinator) resealOne(ctx context.Context, key, oldID string, k sealKeys) (bool, error) {
	for try := 0; try < resealTries; try++ {
		gctx, cancel := store.EtcdCtx(ctx)
		resp, err := c.cli.Get(gctx, key)
		cancel()
		if err != nil {
			return false, err
		}
		if len(resp.Kvs) == 0 {
			return true, nil // deleted meanwhile (retention)
		}
		var rec store.JobRecord
		if err := json.Unmarshal(resp.Kvs[0].Value, &rec); err != nil {
			return false, nil
		}
		nr, m, err := resealRecord(&rec, oldID, k)
		if err != nil {
			return false, nil
		}
		if m == 0 {
			return true, nil
		}
		rev := resp.Kvs[0].ModRevision
		tr, err := c.txnRetry(ctx, func(actx context.Context) (*clientv3.TxnResponse, error) {
			return c.cli.Txn(actx).If(clientv3.Compare(clientv3.ModRevision(key), "=", rev)).Then(clientv3.OpPut(key, store.MustJSON(nr))).Commit()
		})
		if err != nil {
			return false, err
		}
		if tr.Succeeded {
			return true, nil
		}
	}
	return false, nil
}
