package lan

import (
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"net"
	"strconv"
	"time"

	"github.com/hashicorp/serf/serf"

	"apiary.dev/apiary/internal/federation"
)

// Tuned LAN timings (MEASURED.md: the first member-failed event after a
// crash comes in about 0.9 s with 3 members and 1.1 s p50 / 1.7 s max with
// 50, against 5-9 s at serf's defaults). They assume a LAN: ProbeTimeout must
// exceed the round-trip time between any two members.
const (
	ProbeInterval  = 200 * time.Millisecond
	ProbeTimeout   = 100 * time.Millisecond
	SuspicionMult  = 2
	GossipInterval = 50 * time.Millisecond
)

// Windows of the pool. Every process joins under a name of its own
// (MemberName), so a failed or departed member is never refuted by a
// restarted process and would otherwise linger: serf forgets a failed
// member after ReconnectTimeout (trying to reach it again meanwhile, which
// heals a partition) and a departed one after TombstoneTimeout. An agent
// cut off longer rejoins through its own join loop.
const (
	ReconnectTimeout = 10 * time.Minute
	TombstoneTimeout = 10 * time.Minute
	// LeavePropagateDelay is how long Leave waits after broadcasting the
	// intent, so that the pool hears a leave (not a failure) before the
	// member shuts down; about four gossip rounds (serf's default is 1 s).
	LeavePropagateDelay = 200 * time.Millisecond
)

// MemberConfig describes one member of a region's LAN pool.
type MemberConfig struct {
	// Name is unique in the pool; see MemberName.
	Name string
	// Bind is host:port to listen on, UDP and TCP (the same port); port 0
	// picks a free one (memberlist retries the pair of binds).
	Bind string
	// Advertise is host:port the others reach this member at (default:
	// Bind, or a private address of the host when Bind's host is 0.0.0.0).
	Advertise string
	Tags      map[string]string
	Logger    *slog.Logger
	// Gossip encrypts the member's gossip with a keyring (federation.Gossip:
	// a key of 16, 24 or 32 bytes, and the file serf keeps the keyring in
	// so that rotations survive restarts); the zero value gossips in plain
	// text. A member that holds no key of the pool's keyring cannot join
	// it or read its tags, so every coordinator and agent of a region needs
	// one (`apiary region|agent --gossip-key`).
	Gossip federation.Gossip
}

// NewSerfConfig returns a fresh serf config for one LAN member (serf.Create
// mutates the memberlist config, so every instance needs its own, MEASURED.md
// trap 7) with the tuned timings, the LAN windows, and both serf's and
// memberlist's log output routed to Logger (federation.LogWriter). It is
// federation.NewSerfConfig's member, re-tuned for the LAN, with its keyring
// (mc.Gossip, loaded as federation.NewSerfConfig does: the keyring file may
// be read or written). Errors name the field (lan-addr, lan-advertise,
// gossip-key, gossip-keyring-file) and the rule.
func NewSerfConfig(mc MemberConfig) (*serf.Config, error) {
	if _, _, err := federation.SplitHostPort(mc.Bind, "lan-addr"); err != nil {
		return nil, err
	}
	if mc.Advertise != "" {
		if _, _, err := federation.SplitHostPort(mc.Advertise, "lan-advertise"); err != nil {
			return nil, err
		}
	}
	conf, err := federation.NewSerfConfig(federation.MemberConfig{Name: mc.Name, Bind: mc.Bind,
		Advertise: mc.Advertise, Tags: mc.Tags, Logger: mc.Logger, Gossip: mc.Gossip})
	if err != nil {
		return nil, err
	}
	conf.ReconnectTimeout = ReconnectTimeout
	conf.TombstoneTimeout = TombstoneTimeout
	conf.LeavePropagateDelay = LeavePropagateDelay
	ml := conf.MemberlistConfig
	ml.ProbeInterval = ProbeInterval
	ml.ProbeTimeout = ProbeTimeout
	ml.SuspicionMult = SuspicionMult
	ml.GossipInterval = GossipInterval
	return conf, nil
}

// MemberName returns "<role>.<id>.<8 hex digits>", a name of its own for
// each process: a restarted agent or coordinator (on the same address or
// not) joins as a new member instead of waiting for the pool to forget the
// old one (memberlist refuses a known name at a new address). Members are
// matched to nodes and coordinators by their tags, never by name. The name
// holds no '/' (memberlist reads "name/addr" on reconnect) as long as id
// holds none.
func MemberName(role, id string) string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return role + "." + id + "." + hex.EncodeToString(b[:])
}

// Addr is a member's address as host:port, the form JoinLoop and
// RegisterNodeResponse.lan_join use.
func Addr(m serf.Member) string {
	return net.JoinHostPort(m.Addr.String(), strconv.Itoa(int(m.Port)))
}
