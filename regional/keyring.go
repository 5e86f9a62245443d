package regional

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"path/filepath"
	"slices"

	"github.com/hashicorp/serf/serf"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/federation"
	"apiary.dev/apiary/internal/pki"
)

// Gossip encryption of the coordinator's serf pools (Config.GossipKey) and
// AdminService.GossipKeyring, the operator's way to serf's KeyManager
// (`apiary keyring list|install|use|remove`).
//
// Both pools, the region's LAN pool and the federation's WAN pool, start
// from the same key, each with a keyring of its own kept in its own file
// (GossipKeyringFiles): serf rewrites a member's file after every change,
// so a rotation survives a restart, and a file that exists at start is
// loaded instead of the key. A keyring operation is a serf query that
// reaches every member of the pool (LAN: this region's coordinators and
// agents; WAN: every region's coordinators and the routers); rotation is
// install the new key (every member accepts it, still sends with the old),
// use it (every member sends with it), remove the old one. A member that
// missed a step (down at the time) comes back with its old keyring file
// and, once the old key is removed, cannot rejoin until it is given the
// new key (its keyring file removed and --gossip-key set to the new key).
//
// The LAN keyring also seals the jobs' secret_env (secrets.go): the
// primary key seals, any installed key opens. So a removal from the LAN
// pool first re-seals, under the primary key, every stored value sealed
// under the key going away, and is refused (FAILED_PRECONDITION, nothing
// removed from any pool) while some job still depends on it. install and
// use need no re-sealing.

// DefaultGossipKeyringFile is the LAN member's keyring file under the
// coordinator's data dir when Config.GossipKeyringFile is empty.
const DefaultGossipKeyringFile = "gossip.keyring"

// wanKeyringSuffix is appended to the LAN keyring file's path for the WAN
// member's.
const wanKeyringSuffix = ".wan"

// GossipKeyringFiles returns the keyring files of the LAN and WAN members:
// Config.GossipKeyringFile (default <Etcd.DataDir>/gossip.keyring) and the
// same path with ".wan" appended.
func (c *Config) GossipKeyringFiles() (lanFile, wanFile string) {
	lanFile = c.GossipKeyringFile
	if lanFile == "" {
		lanFile = filepath.Join(c.Etcd.DataDir, DefaultGossipKeyringFile)
	}
	return lanFile, lanFile + wanKeyringSuffix
}

// validateGossip checks GossipKey's length (errors name --gossip-key and
// never repeat the key).
func (c *Config) validateGossip() error {
	if c.GossipKey == nil {
		return nil
	}
	if n := len(c.GossipKey); n != 16 && n != 24 && n != 32 {
		return fmt.Errorf("gossip-key: a key must be 16, 24 or 32 bytes, this one is %d (make one with `apiary keygen`)", n)
	}
	return nil
}

// gossip is the encryption of the pool's member ("lan" or "wan").
func (c *Coordinator) gossip(pool string) federation.Gossip {
	lanFile, wanFile := c.cfg.GossipKeyringFiles()
	if pool == poolWAN {
		return federation.Gossip{Key: c.cfg.GossipKey, KeyringFile: wanFile}
	}
	return federation.Gossip{Key: c.cfg.GossipKey, KeyringFile: lanFile}
}

// warnPlainGossip logs at WARN when the pool's member gossips in plain
// text while the gRPC hops use TLS: anyone who reaches the pool's port can
// then join it, read every member's tags and send it failure rumours. It
// does not refuse: agents on older configurations must still start.
func (c *Coordinator) warnPlainGossip(pool string, sc *serf.Config) {
	if c.cfg.TLS == nil || sc.MemberlistConfig.Keyring != nil {
		return
	}
	c.log.Warn("gossip is unencrypted: TLS is on but the serf "+pool+" pool runs without a key, so anyone who can reach its port "+
		"can join it, read its members' tags and report members failed; give every member --gossip-key (apiary keygen; README, \"Gossip encryption\")",
		"pool", pool)
}

// Pool names of GossipKeyringRequest.pool.
const (
	poolLAN = "lan"
	poolWAN = "wan"
)

// GossipKeyring serves AdminService.GossipKeyring (see the proto): the
// operation on every pool asked for, through serf's KeyManager; members'
// failures are reported per pool. Only client certificates may call it
// when the API serves TLS (the authorization gate admits the API's
// callers; this narrows it to operators).
func (s *adminServer) GossipKeyring(ctx context.Context, req *apiaryv1.GossipKeyringRequest) (*apiaryv1.GossipKeyringResponse, error) {
	c := s.c
	by := "plaintext caller (--insecure-dev)"
	if c.cfg.TLS != nil {
		id, err := pki.PeerIdentity(ctx)
		if err != nil {
			return nil, status.Error(codes.Unauthenticated, "GossipKeyring needs a client certificate: "+err.Error())
		}
		if id.Role != pki.RoleClient {
			return nil, status.Errorf(codes.PermissionDenied, "a %s certificate (%s) cannot change or list the gossip keyring: "+
				"only client certificates (operators) can", id.Role, id)
		}
		by = id.String()
	}
	var key string
	switch req.GetOp() {
	case apiaryv1.GossipKeyringOp_GOSSIP_KEYRING_OP_LIST:
	case apiaryv1.GossipKeyringOp_GOSSIP_KEYRING_OP_INSTALL, apiaryv1.GossipKeyringOp_GOSSIP_KEYRING_OP_USE,
		apiaryv1.GossipKeyringOp_GOSSIP_KEYRING_OP_REMOVE:
		raw, err := federation.DecodeGossipKey(req.GetKey())
		if err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "key: %v", err)
		}
		key = base64.StdEncoding.EncodeToString(raw)
	default:
		return nil, status.Errorf(codes.InvalidArgument, "op: must be list, install, use or remove (got %v)", req.GetOp())
	}
	pools, err := c.keyringPools(req.GetPool())
	if err != nil {
		return nil, err
	}
	if req.GetOp() == apiaryv1.GossipKeyringOp_GOSSIP_KEYRING_OP_REMOVE && slices.ContainsFunc(pools, func(p keyringPool) bool { return p.name == poolLAN }) {
		// The LAN key also seals secret_env: no stored secret may depend
		// on it once it is gone (secrets.go). Refused, nothing is removed
		// from any pool.
		if _, err := c.resealSecrets(ctx, key); err != nil {
			return nil, err
		}
	}
	out := &apiaryv1.GossipKeyringResponse{}
	for _, p := range pools {
		resp, err := keyringOp(p.serf.KeyManager(), req.GetOp(), key)
		r := &apiaryv1.GossipKeyringPool{Pool: p.name}
		if resp != nil {
			r.Members, r.Responses, r.Failures = int32(resp.NumNodes), int32(resp.NumResp), int32(resp.NumErr)
			r.Messages = resp.Messages
			r.Keys, r.PrimaryKeys = counts(resp.Keys), counts(resp.PrimaryKeys)
		}
		if err != nil {
			r.Error = err.Error()
		}
		out.Pools = append(out.Pools, r)
		c.log.Info("gossip keyring", "op", opName(req.GetOp()), "pool", p.name, "key", KeyFingerprint(key), "by", by,
			"members", r.Members, "responses", r.Responses, "failures", r.Failures, "err", r.Error)
	}
	return out, nil
}

// keyringPool is one of the coordinator's serf members.
type keyringPool struct {
	name string
	serf *serf.Serf
}

// keyringPools returns the members pool names ("lan", "wan", "": both that
// run), each running and encrypted, or a status error: InvalidArgument for
// another name, FailedPrecondition for a pool not run or not encrypted.
func (c *Coordinator) keyringPools(pool string) ([]keyringPool, error) {
	c.lan.mu.Lock()
	lanSerf := c.lan.serf
	c.lan.mu.Unlock()
	c.wan.mu.Lock()
	wanSerf := c.wan.serf
	c.wan.mu.Unlock()
	all := []keyringPool{{poolLAN, lanSerf}, {poolWAN, wanSerf}}
	var out []keyringPool
	switch pool {
	case "":
		for _, p := range all {
			if p.serf != nil {
				out = append(out, p)
			}
		}
		if len(out) == 0 {
			return nil, status.Error(codes.FailedPrecondition, "this coordinator runs no serf pool (neither --lan-addr nor --wan-bind/--wan-join)")
		}
	case poolLAN, poolWAN:
		for _, p := range all {
			if p.name != pool {
				continue
			}
			if p.serf == nil {
				flag := map[string]string{poolLAN: "--lan-addr", poolWAN: "--wan-bind/--wan-join"}[pool]
				return nil, status.Errorf(codes.FailedPrecondition, "this coordinator runs no %s pool (%s)", pool, flag)
			}
			out = append(out, p)
		}
	default:
		return nil, status.Errorf(codes.InvalidArgument, "pool: must be lan, wan or empty for both (got %q)", pool)
	}
	for _, p := range out {
		if !p.serf.EncryptionEnabled() {
			return nil, status.Errorf(codes.FailedPrecondition, "the %s pool gossips in plain text: there is no keyring to list or "+
				"change; start every member with --gossip-key (apiary keygen) to encrypt it", p.name)
		}
	}
	return out, nil
}

// keyringOp runs op on km: the query reaches every member of km's pool.
func keyringOp(km *serf.KeyManager, op apiaryv1.GossipKeyringOp, key string) (*serf.KeyResponse, error) {
	switch op {
	case apiaryv1.GossipKeyringOp_GOSSIP_KEYRING_OP_LIST:
		return km.ListKeys()
	case apiaryv1.GossipKeyringOp_GOSSIP_KEYRING_OP_INSTALL:
		return km.InstallKey(key)
	case apiaryv1.GossipKeyringOp_GOSSIP_KEYRING_OP_USE:
		return km.UseKey(key)
	case apiaryv1.GossipKeyringOp_GOSSIP_KEYRING_OP_REMOVE:
		return km.RemoveKey(key)
	}
	return nil, errors.New("unknown op")
}

func counts(m map[string]int) map[string]int32 {
	if len(m) == 0 {
		return nil
	}
	out := make(map[string]int32, len(m))
	for k, v := range m {
		if k == "" { // members that answered with no primary key (a failure)
			continue
		}
		out[k] = int32(v)
	}
	return out
}

func opName(op apiaryv1.GossipKeyringOp) string {
	switch op {
	case apiaryv1.GossipKeyringOp_GOSSIP_KEYRING_OP_LIST:
		return "list"
	case apiaryv1.GossipKeyringOp_GOSSIP_KEYRING_OP_INSTALL:
		return "install"
	case apiaryv1.GossipKeyringOp_GOSSIP_KEYRING_OP_USE:
		return "use"
	case apiaryv1.GossipKeyringOp_GOSSIP_KEYRING_OP_REMOVE:
		return "remove"
	}
	return op.String()
}

// KeyFingerprint names a gossip key in logs without revealing it: the
// first 8 hex digits of the SHA-256 of its base64 form ("" for "").
func KeyFingerprint(key string) string {
	if key == "" {
		return ""
	}
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:4])
}
