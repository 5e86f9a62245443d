package agent

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/grafana/dskit/backoff"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
)

// errEpochLost means the node epoch is gone: a coordinator answered
// FAILED_PRECONDITION.
var errEpochLost = errors.New("node epoch lost")

// errFailedOver ends a stream because the agent moved to another coordinator.
var errFailedOver = errors.New("moved to another coordinator")

// Fallbacks when a coordinator leaves the timing fields of
// RegisterNodeResponse at zero.
const (
	fallbackHeartbeat = time.Second
	fallbackLeaseTTL  = 10 * time.Second
)

// session is one node epoch: registered once, then kept alive by heartbeats
// and fed by an assignment stream, until the epoch is lost or ctx ends.
type session struct {
	coords     *coordinators
	nodeID     string
	epoch      int64
	region     string
	heartbeat  time.Duration
	leaseTTL   time.Duration
	rpcTimeout time.Duration
	backoff    backoff.Config
	log        *slog.Logger
	// datasets is the node's dataset cache (nil without one);
	// datasetsSent the version the region has (sent at registration or
	// with an answered heartbeat).
	datasets     *datasetCache
	datasetsSent int64
}

// remindEvery is how often an answer that stays the same (a refused
// registration, a coordinator that keeps failing the same way) is logged
// again at its level; in between, repeats go to DEBUG.
const remindEvery = 5 * time.Minute

// refusedForGood reports whether err is a coordinator's refusal of this
// node that no retry fixes by itself (PERMISSION_DENIED, UNAUTHENTICATED:
// a revoked, unknown or foreign join token, a join token bound to another
// node, a certificate the region's authorization refuses), as opposed to an
// outage (UNAVAILABLE, DEADLINE_EXCEEDED), which ends when the region is
// back. Only an operator can change the answer (a new token, a fixed ACL).
func refusedForGood(err error) bool {
	c := status.Code(err)
	return c == codes.PermissionDenied || c == codes.Unauthenticated
}

// register creates a new node epoch, retrying with backoff (and moving to
// the next coordinator) until it succeeds or ctx ends. Every retry carries
// the same random registration_id, so a retry of a call that committed
// (its answer lost or too slow) gets that epoch back rather than ending it. It returns ctx's
// error, or an error wrapping the coordinator's INVALID_ARGUMENT answer (the
// node's own description is refused: bad node id, zero capacity), which no
// retry can fix. A refusal of the node itself (refusedForGood: its join
// token, its certificate) is passed to refused (if not nil) at every such
// answer, logged at ERROR with what to do once per distinct answer and
// again every remindEvery while it recurs (repeatLog), and retried with backoff like
// an unavailable coordinator: it is fixed outside the agent, and the agent
// must then register without a restart. Other failures are logged at WARN
// when they are new for their coordinator (then every remindEvery), with a
// hint when the agent's TLS settings are the cause (tlsMismatch, once per
// coordinator).
func register(ctx context.Context, coords *coordinators, req *apiaryv1.RegisterNodeRequest,
	rpcTimeout time.Duration, bo backoff.Config, log *slog.Logger, refused func(answer string)) (*session, error) {
	// One registration id for this call's retries: a retry of an attempt
	// that committed but answered too late gets that epoch back instead of
	// ending it (RegisterNodeRequest.registration_id).
	req = proto.CloneOf(req)
	req.RegistrationId = rand.Text()
	b := backoff.New(ctx, bo)
	explained := map[string]bool{}    // addresses whose TLS mismatch was logged
	var refusal repeatLog             // the region's refusals of this node
	failed := map[string]*repeatLog{} // per coordinator: its other failures
	for b.Ongoing() {
		idx, cl := coords.client()
		cctx, cancel := context.WithTimeout(ctx, rpcTimeout)
		var p peer.Peer
		resp, err := cl.RegisterNode(cctx, req, grpc.Peer(&p))
		cancel()
		if err == nil {
			s := &session{
				coords:     coords,
				nodeID:     req.GetNodeId(),
				epoch:      resp.GetNodeEpoch(),
				region:     resp.GetRegion(),
				heartbeat:  time.Duration(resp.GetHeartbeatIntervalMs()) * time.Millisecond,
				leaseTTL:   time.Duration(resp.GetLeaseTtlMs()) * time.Millisecond,
				rpcTimeout: rpcTimeout,
				backoff:    bo,
				log:        log,
			}
			if s.heartbeat <= 0 {
				s.heartbeat = fallbackHeartbeat
			}
			if s.leaseTTL <= 0 {
				s.leaseTTL = fallbackLeaseTTL
			}
			if refusal.logged() {
				log.Info("registration accepted after being refused", "coordinator", coords.addr(idx), "refused_with", refusal.last)
			}
			log.Info("registered", "coordinator", coords.addr(idx), "epoch", s.epoch,
				"region", s.region, "heartbeat", s.heartbeat, "lease_ttl", s.leaseTTL)
			return s, nil
		}
		if ctx.Err() != nil {
			break
		}
		if status.Code(err) == codes.InvalidArgument {
			return nil, fmt.Errorf("register: refused by %s: %w", coords.addr(idx), err)
		}
		if refusedForGood(err) {
			// Refused for its join token (or identity): an operator
			// must act, but the agent keeps trying (a token may be
			// created, or the region's ACLs fixed, while it waits). Said
			// once per distinct answer and again every remindEvery, not
			// every retry; what the agent still holds of its ended epoch
			// is killed (refused: Agent.dropRefused).
			msg := status.Convert(err).Message()
			refusal.log(log, slog.LevelError, msg, "registration refused: "+msg+"; "+joinTokenHint(req, msg)+"; retrying with backoff",
				"coordinator", coords.addr(idx))
			if refused != nil {
				refused(msg)
			}
			b.Wait()
			continue
		}
		addr := coords.addr(idx)
		if failed[addr] == nil {
			failed[addr] = &repeatLog{}
		}
		failed[addr].log(log, slog.LevelWarn, err.Error(), "register failed", "coordinator", addr, "err", err)
		if !explained[addr] {
			if why := tlsMismatch(ctx, addr, err, &p); why != "" {
				explained[addr] = true
				log.Error(why, "coordinator", addr)
			}
		}
		coords.failover(idx)
		b.Wait()
	}
	return nil, ctx.Err()
}

// repeatLog logs a message that recurs (a retried call failing): at its
// level once per distinct cause (a key, e.g. the error's text; failures
// that alternate, "EOF" and "connection reset", are each said once), again
// every remindEvery while a cause recurs (with how many repeats were kept
// quiet), and at DEBUG in between.
type repeatLog struct {
	said  map[string]time.Time // cause -> when it was last logged at its level
	quiet map[string]int       // cause -> repeats since
	last  string               // the latest cause
}

// repeatLogCauses bounds the causes remembered (error texts that vary
// without end would otherwise grow the map); past it, all are forgotten.
const repeatLogCauses = 64

func (r *repeatLog) log(log *slog.Logger, level slog.Level, cause, msg string, args ...any) {
	if r.said == nil || len(r.said) >= repeatLogCauses {
		r.said, r.quiet = map[string]time.Time{}, map[string]int{}
	}
	r.last = cause
	at, ok := r.said[cause]
	if ok && time.Since(at) < remindEvery {
		r.quiet[cause]++
		log.Debug(msg, args...)
		return
	}
	if ok {
		args = append(args, "repeats", r.quiet[cause], "since", time.Since(at).Round(time.Second))
	}
	log.Log(context.Background(), level, msg, args...)
	r.said[cause], r.quiet[cause] = time.Now(), 0
}

// logged reports whether anything was logged.
func (r *repeatLog) logged() bool { return r.last != "" }

// joinTokenHint is what an operator is told when a region refused the
// node's registration (answer: the region's message) for its join token.
func joinTokenHint(req *apiaryv1.RegisterNodeRequest, answer string) string {
	hint := "the join token sent is not valid for this node"
	if req.GetJoinToken() == "" {
		hint = "the agent sent no join token"
	}
	hint += "; give it a join token of its region as --join-token-file FILE or $APIARY_JOIN_TOKEN"
	if !strings.Contains(answer, "apiary acl token create") {
		hint += " (create one with `apiary acl token create --type agent --region R --node-id " + req.GetNodeId() + " --name NAME`)"
	}
	return hint
}

// heartbeatLoop renews the lease every heartbeat interval and passes each
// answer to contact. It returns errEpochLost when a coordinator answers that
// the epoch is gone (FAILED_PRECONDITION) or refuses the node
// (refusedForGood), or ctx's error. While no coordinator answers it keeps
// trying (a quarter interval apart): the agent cannot tell an outage of the
// region, which leaves its lease alive (etcd is down with it, and a new etcd
// leader refreshes every lease), from a partition that let it lapse, until
// a coordinator answers.
func (s *session) heartbeatLoop(ctx context.Context, contact func(*apiaryv1.HeartbeatResponse)) error {
	lastOK := time.Now()
	warned := false
	t := time.NewTimer(s.heartbeat)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
		idx, cl := s.coords.client()
		// Short enough that a coordinator that hangs (paused, partitioned)
		// is left for the next one well before the lease runs out.
		cctx, cancel := context.WithTimeout(ctx, min(s.rpcTimeout, max(s.heartbeat, s.leaseTTL/3)))
		req := &apiaryv1.HeartbeatRequest{NodeId: s.nodeID, NodeEpoch: s.epoch}
		list, version := s.datasets.snapshot()
		if version != s.datasetsSent {
			req.DatasetsChanged, req.Datasets = true, list
		}
		resp, err := cl.Heartbeat(cctx, req)
		cancel()
		next := s.heartbeat
		switch {
		case err == nil:
			s.datasetsSent = version
			if warned {
				s.log.Info("coordinators answer again; the epoch lives", "epoch", s.epoch,
					"disconnected_for", time.Since(lastOK).Round(time.Millisecond))
			}
			lastOK, warned = time.Now(), false
			if ttl := time.Duration(resp.GetLeaseTtlMs()) * time.Millisecond; ttl > 0 {
				s.leaseTTL = ttl
			}
			// The region's interval for its fleet as it is now (a fleet
			// that grew asks for fewer beats), never past a quarter of
			// the lease.
			if iv := time.Duration(resp.GetHeartbeatIntervalMs()) * time.Millisecond; iv > 0 && iv != s.heartbeat {
				s.heartbeat = min(iv, s.leaseTTL/4)
				next = s.heartbeat
			}
			contact(resp)
		case ctx.Err() != nil:
			return ctx.Err()
		case status.Code(err) == codes.FailedPrecondition:
			s.log.Warn("node epoch gone", "epoch", s.epoch, "coordinator", s.coords.addr(idx), "err", err)
			return errEpochLost
		case refusedForGood(err):
			// The region refuses this node (its certificate): no
			// coordinator renews the lease, so the epoch is as good as
			// gone. Registering again says whether the refusal stands
			// (then the epoch's attempts are killed) or was a fluke
			// (then they are offered for adoption).
			s.log.Warn("heartbeat refused; treating the epoch as ended", "epoch", s.epoch, "coordinator", s.coords.addr(idx), "err", err)
			return errEpochLost
		default:
			s.log.Debug("heartbeat failed", "epoch", s.epoch, "coordinator", s.coords.addr(idx), "err", err)
			s.coords.failover(idx)
			// Retry sooner than a full interval: the lease is running out.
			next = max(s.heartbeat/4, 10*time.Millisecond)
			if !warned && time.Since(lastOK) >= s.leaseTTL {
				warned = true
				s.log.Warn("no coordinator answered for a whole lease TTL; attempts keep running up to their lost_after",
					"epoch", s.epoch, "lease_ttl", s.leaseTTL, "err", err)
			}
		}
		t.Reset(next)
	}
}

// streamLoop keeps an assignment stream open for the epoch, reconnecting
// with backoff (and moving to the next coordinator) after errors, and passes
// each assignment to handle in order. It returns errEpochLost if the
// coordinator refuses the epoch (FAILED_PRECONDITION), or ctx's error.
func (s *session) streamLoop(ctx context.Context, handle func(*apiaryv1.Assignment)) error {
	b := backoff.New(ctx, s.backoff)
	for b.Ongoing() {
		idx, cl := s.coords.client()
		opened := time.Now()
		n, err := s.streamOnce(ctx, idx, cl, handle)
		if ctx.Err() != nil {
			break
		}
		if status.Code(err) == codes.FailedPrecondition {
			s.log.Warn("assignment stream refused the epoch", "epoch", s.epoch, "err", err)
			return errEpochLost
		}
		if n > 0 || time.Since(opened) > s.backoff.MaxBackoff {
			b.Reset()
		}
		if cur, _ := s.coords.watch(); cur != idx {
			s.log.Info("assignment stream moving to the coordinator in use",
				"from", s.coords.addr(idx), "to", s.coords.addr(cur))
		} else {
			s.log.Warn("assignment stream ended; reconnecting", "coordinator", s.coords.addr(idx), "received", n, "err", err)
			if err == nil || status.Code(err) == codes.Unavailable || errors.Is(err, io.EOF) {
				s.coords.failover(idx)
			}
		}
		b.Wait()
	}
	return ctx.Err()
}

// streamOnce runs one stream until it fails; it returns the number of
// assignments received and the error that ended it (nil on a clean EOF).
//
// The stream follows failover: when another part of the agent (heartbeats,
// reports) moves to the next coordinator, the stream is reopened there too,
// so that a coordinator that hangs without closing its connections cannot
// keep the node starved of assignments while its heartbeats succeed
// elsewhere.
func (s *session) streamOnce(ctx context.Context, idx int, cl apiaryv1.AgentServiceClient, handle func(*apiaryv1.Assignment)) (int, error) {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	cur, changed := s.coords.watch()
	if cur != idx {
		return 0, errFailedOver
	}
	go func() {
		select {
		case <-sctx.Done():
		case <-changed:
			cancel()
		}
	}()
	st, err := cl.StreamAssignments(sctx, &apiaryv1.StreamAssignmentsRequest{NodeId: s.nodeID, NodeEpoch: s.epoch})
	if err != nil {
		return 0, fmt.Errorf("open: %w", err)
	}
	n := 0
	for {
		msg, err := st.Recv()
		if err == io.EOF {
			return n, nil
		}
		if err != nil {
			return n, err
		}
		n++
		if a := msg.GetAssignment(); a != nil {
			handle(a)
		}
	}
}
