package scheduler

import (
	"context"
	"errors"
	"slices"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"apiary.dev/apiary/regional/store"
)

// maxRetentionDeletes bounds the jobs deleted per sweep (one Txn, fenced
// on the shards of the jobs it deletes), and maxRetentionKeys the keys it
// deletes (a job's record, dedup key, tasks and attempt results; at least
// one job per sweep, however large: a job is deleted in one Txn).
const (
	maxRetentionDeletes = 200
	maxRetentionKeys    = 10000
)

// sweepRetention deletes jobs that have been terminal for longer than the
// retention period: the job record, its tasks, its attempt results and its
// dedup key go in one fenced Txn per sweep, so a job is never half-deleted;
// a sweep deletes at most maxRetentionDeletes jobs and, beyond its first
// job, maxRetentionKeys keys, so one sweep is one bounded raft entry and a
// bounded burst of watch events. Finished jobs are found from the cache's
// per-job counts (jobDone), without reading tasks. etcd's periodic
// compaction then reclaims the space.
func (s *Loop) sweepRetention(ctx context.Context, now time.Time) error {
	keep := s.d.Retention
	if keep <= 0 {
		return nil
	}
	cutoff := now.Add(-keep).UnixMilli()
	var cmps []clientv3.Cmp
	var ops []clientv3.Op
	var victims []string
	c := s.cache
	var fences []store.Fence
	keys := 0
	for jobID, d := range c.jobDone {
		if len(victims) >= maxRetentionDeletes {
			break
		}
		if d.tasks == 0 || d.terminal < d.tasks || d.finishedMs == 0 || d.finishedMs > cutoff {
			continue
		}
		j := c.jobs[jobID]
		if j == nil {
			continue
		}
		e, owned := s.owned[j.rec.Shard]
		if !owned {
			continue
		}
		// Estimated: each task has a record and, usually, one attempt
		// result (retries add more).
		if n := 2 + 2*d.tasks; len(victims) > 0 && keys+n > maxRetentionKeys {
			continue
		} else {
			keys += n
		}
		jk := store.KeyJob(j.rec.Shard, jobID)
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(jk), "=", j.modRev))
		ops = append(ops, clientv3.OpDelete(jk),
			clientv3.OpDelete(store.PrefJobTasks(j.rec.Shard, jobID), clientv3.WithPrefix()),
			clientv3.OpDelete(store.PrefJobResults(j.rec.Shard, jobID), clientv3.WithPrefix()))
		if j.rec.RequestID != "" {
			ops = append(ops, clientv3.OpDelete(store.KeyDedup(j.rec.ClientID, j.rec.RequestID)))
		}
		victims = append(victims, jobID)
		if f := (store.Fence{Shard: j.rec.Shard, Epoch: e}); !slices.Contains(fences, f) {
			fences = append(fences, f)
		}
	}
	if len(victims) == 0 {
		return nil
	}
	resp, err := s.d.Commit.FencedTxn(ctx, fences, cmps, ops)
	var fe *store.FencedError
	if errors.As(err, &fe) {
		s.dropShards(fe.Shards, "retention")
		return nil
	}
	if err != nil {
		return err
	}
	if !resp.Succeeded {
		return nil // a job changed (e.g. cancel); the next sweep re-evaluates
	}
	for _, id := range victims {
		c.removeJob(id)
	}
	s.d.Log.Info("deleted jobs past retention", "jobs", len(victims), "retention", keep)
	return nil
}

// sweepScopeKeys deletes the anti-affinity scope keys of groups that no
// cached job names any more (their jobs were deleted by retention), so that
// a group name per job does not leave keys behind for ever. Each group's
// keys are swept by the owner of the group's shard (shards.Of of its name),
// compared on their ModRevision (a plan that rewrote one meanwhile wins),
// at most maxOpsPerFenced per sweep.
func (s *Loop) sweepScopeKeys(ctx context.Context) error {
	c := s.cache
	var ws []write
	n := 0
	for key, rev := range c.aaRev {
		if n >= maxOpsPerFenced {
			break
		}
		group, ok := store.AntiAffinityKeyGroup(key)
		if !ok || len(c.aaJobs[group]) > 0 {
			continue
		}
		sh := s.homeShard(group)
		if !s.owns(sh) {
			continue
		}
		n++
		ws = append(ws, write{shards: []int{sh},
			cmps:  []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(key), "=", rev)},
			ops:   []clientv3.Op{clientv3.OpDelete(key)},
			after: func(int64) { delete(c.aaRev, key) },
		})
	}
	return s.commit(ctx, ws)
}
