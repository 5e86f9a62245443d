package failover

import (
	"context"
	"encoding/json"
	"slices"
	"sort"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/regional/store"
	"apiary.dev/apiary/regional/taskstate"
)

// maxBatch bounds the entries of one PushProgress call.
const maxBatch = 2000

// hjob is a failover job of this region whose progress the leader pushes.
type hjob struct {
	idx      store.HomeIndexRecord
	sent     map[int32]bool // completions queued
	terminal map[int32]bool
	ended    bool
	endAcks  int // standbys that took the job's end
}

// progressLoop, on the region's failover leader, pushes the completions of
// its failover jobs to their standbys (asynchronously, batched every
// pushEvery), and the jobs that ended (their standby records are then
// dropped). It reads the failover index and those jobs' tasks once, then
// follows a watch of the index and of the task records.
func (m *Manager) progressLoop(ctx context.Context) {
	for ctx.Err() == nil {
		if !m.leader(ctx) {
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Second):
			}
			continue
		}
		if err := m.pushRun(ctx); err != nil && ctx.Err() == nil {
			m.cfg.Log.Info("failover: progress loop restarts", "err", err)
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		}
	}
}

func (m *Manager) pushRun(ctx context.Context) error {
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	jobs := map[string]*hjob{}
	cctx, ccancel := store.EtcdCtx(rctx)
	resp, err := m.cfg.Client.Get(cctx, store.PrefFailoverHome, clientv3.WithPrefix())
	ccancel()
	if err != nil {
		return err
	}
	rev := resp.Header.Revision
	for _, kv := range resp.Kvs {
		m.track(jobs, string(kv.Key[len(store.PrefFailoverHome):]), kv.Value)
	}
	for id, j := range jobs {
		cctx, ccancel := store.EtcdCtx(rctx)
		tr, err := m.cfg.Client.Get(cctx, store.PrefJobTasks(j.idx.Shard, id), clientv3.WithPrefix(), clientv3.WithRev(rev))
		ccancel()
		if err != nil {
			return err
		}
		if len(tr.Kvs) == 0 {
			// The job is gone (retention): its index goes too.
			m.cfg.Client.Delete(rctx, store.KeyFailoverHome(id))
			delete(jobs, id)
			continue
		}
		for _, kv := range tr.Kvs {
			m.taskEvent(jobs, kv.Key, kv.Value)
		}
	}
	wopts := []clientv3.OpOption{clientv3.WithPrefix(), clientv3.WithRev(rev + 1)}
	wi := m.cfg.Client.Watch(clientv3.WithRequireLeader(rctx), store.PrefFailoverHome, wopts...)
	wt := m.cfg.Client.Watch(clientv3.WithRequireLeader(rctx), store.PrefTasks, wopts...)
	tick := time.NewTicker(pushEvery)
	defer tick.Stop()
	leaderCheck := time.NewTicker(2 * time.Second)
	defer leaderCheck.Stop()
	for {
		select {
		case <-rctx.Done():
			return nil
		case <-leaderCheck.C:
			if !m.leader(rctx) {
				return nil
			}
		case wr, ok := <-wi:
			if !ok || wr.Err() != nil {
				return errWatch(wr)
			}
			for _, ev := range wr.Events {
				id := string(ev.Kv.Key[len(store.PrefFailoverHome):])
				if ev.Type == clientv3.EventTypeDelete {
					delete(jobs, id)
				} else if jobs[id] == nil {
					m.track(jobs, id, ev.Kv.Value)
				}
			}
		case wr, ok := <-wt:
			if !ok || wr.Err() != nil {
				return errWatch(wr)
			}
			for _, ev := range wr.Events {
				if ev.Type == clientv3.EventTypePut {
					m.taskEvent(jobs, ev.Kv.Key, ev.Kv.Value)
				}
			}
		case <-tick.C:
			for id, n := range m.flush(rctx) {
				j := jobs[id]
				if j == nil {
					continue
				}
				if j.endAcks += n; j.endAcks >= len(j.endTo()) {
					if _, err := m.cfg.Client.Delete(rctx, store.KeyFailoverHome(id)); err == nil {
						delete(jobs, id)
					}
				}
			}
		}
	}
}

type watchErr struct{ msg string }

func (e watchErr) Error() string { return e.msg }

func errWatch(wr clientv3.WatchResponse) error {
	if err := wr.Err(); err != nil {
		return err
	}
	return watchErr{"watch closed"}
}

// endTo are the standbys told of the job's progress and end: those that
// took its record and those whose write failed (it may have committed).
func (j *hjob) endTo() []string {
	out := slices.Clone(j.idx.Standbys)
	for _, s := range j.idx.Unacked {
		if !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	return out
}

func (m *Manager) track(jobs map[string]*hjob, id string, value []byte) {
	var idx store.HomeIndexRecord
	if json.Unmarshal(value, &idx) != nil || len(idx.Standbys) == 0 {
		return
	}
	jobs[id] = &hjob{idx: idx, sent: map[int32]bool{}, terminal: map[int32]bool{}}
}

// taskEvent queues a tracked job's completed task for its standbys, and the
// job's end once every task is terminal.
func (m *Manager) taskEvent(jobs map[string]*hjob, key, value []byte) {
	_, id, index, ok := store.ParseTaskKey(string(key))
	if !ok {
		return
	}
	j := jobs[id]
	if j == nil || j.ended {
		return
	}
	var t taskstate.Task
	if json.Unmarshal(value, &t) != nil {
		return
	}
	if t.State == apiaryv1.TaskState_TASK_STATE_COMPLETE && !j.sent[index] {
		j.sent[index] = true
		d := &apiaryv1.TaskDone{JobId: id, TaskIndex: index, Attempt: t.Attempt, FencingToken: t.FencingToken, DoneTimeMs: t.FinishedMs,
			NodeId: t.NodeID, StartTimeMs: t.StartedMs}
		// To the standbys whose write timed out too: one that committed it
		// late holds a record, and must not rerun this task if it takes
		// the job over.
		m.enqueue(j.endTo(), func(b *batch) { b.done = append(b.done, d) })
	}
	if taskstate.Terminal(t.State) {
		j.terminal[index] = true
	}
	if int32(len(j.terminal)) >= j.idx.TaskCount && j.idx.TaskCount > 0 {
		j.ended = true
		// The end goes to the standbys whose write timed out too: one may
		// have committed it late, and must not keep the record.
		m.enqueue(j.endTo(), func(b *batch) { b.ended = append(b.ended, id) })
	}
}

func (m *Manager) enqueue(standbys []string, add func(*batch)) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, s := range standbys {
		b := m.queue[s]
		if b == nil {
			b = &batch{}
			m.queue[s] = b
		}
		add(b)
	}
}

// flush sends each standby its queued progress (up to maxBatch entries per
// call); what a standby did not take stays queued. It returns, per job
// whose end was taken, by how many standbys.
func (m *Manager) flush(ctx context.Context) map[string]int {
	up := map[string]bool{}
	for _, r := range m.Regions() {
		up[r.Name] = r.Up
	}
	m.mu.Lock()
	regions := make([]string, 0, len(m.queue))
	for r, b := range m.queue {
		// A standby that is down keeps its queue until it is back.
		if len(b.done)+len(b.ended) > 0 && up[r] {
			regions = append(regions, r)
		}
	}
	m.mu.Unlock()
	sort.Strings(regions)
	// Each standby in parallel: one that does not answer (down, and not
	// yet seen so) delays no other.
	var mu sync.Mutex
	var wg sync.WaitGroup
	endedBy := map[string]int{}
	for _, region := range regions {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ended := m.flushRegion(ctx, region)
			mu.Lock()
			for _, id := range ended {
				endedBy[id]++
			}
			mu.Unlock()
		}()
	}
	wg.Wait()
	return endedBy
}

// flushRegion sends one batch to region; it returns the jobs whose end
// it took.
func (m *Manager) flushRegion(ctx context.Context, region string) []string {
	m.mu.Lock()
	b := m.queue[region]
	nd := min(len(b.done), maxBatch)
	ne := min(len(b.ended), maxBatch-nd)
	req := &apiaryv1.PushProgressRequest{HomeRegion: m.cfg.Meta.Region, Done: slices.Clone(b.done[:nd]), Ended: slices.Clone(b.ended[:ne])}
	m.mu.Unlock()
	cctx, cancel := context.WithTimeout(ctx, putTimeout)
	var resp *apiaryv1.PushProgressResponse
	err := m.call(cctx, region, func(ctx context.Context, c apiaryv1.FailoverServiceClient) (err error) {
		resp, err = c.PushProgress(ctx, req)
		return err
	})
	cancel()
	if err != nil {
		m.cfg.Log.Debug("failover: push progress", "standby", region, "err", err)
		return nil
	}
	if u := resp.GetUnknown(); len(u) > 0 {
		// The standby holds no record of these jobs (dropped, claimed
		// away, or its write timed out and never committed).
		m.cfg.Log.Info("failover: a standby holds no record of jobs of this region", "standby", region, "jobs", len(u), "first", u[0])
	}
	m.mu.Lock()
	b.done = b.done[nd:]
	b.ended = b.ended[ne:]
	m.mu.Unlock()
	return req.Ended
}

// TellEnded tells standbys that a job of this region ended (they drop its
// record and keep a tombstone). Best effort: a failure is logged.
func (m *Manager) TellEnded(jobID string, standbys []string) {
	for _, region := range standbys {
		ctx, cancel := context.WithTimeout(context.Background(), putTimeout)
		err := m.call(ctx, region, func(ctx context.Context, c apiaryv1.FailoverServiceClient) error {
			_, err := c.PushProgress(ctx, &apiaryv1.PushProgressRequest{HomeRegion: m.cfg.Meta.Region, Ended: []string{jobID}})
			return err
		})
		cancel()
		if err != nil {
			m.cfg.Log.Warn("failover: could not tell a standby that a job ended", "job", jobID, "standby", region, "err", err)
		}
	}
}
