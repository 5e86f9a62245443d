package federation

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/hashicorp/serf/serf"
)

// Tuned WAN timings (MEASURED.md: first member-failed event after a crash in
// about 0.9 s with 3 members, 1.1 s p50 / 1.7 s max with 50, against 5-9 s at
// serf's defaults). Loopback and LAN-like links only: over a real WAN,
// ProbeTimeout must exceed the round-trip time.
const (
	ProbeInterval  = 200 * time.Millisecond
	ProbeTimeout   = 100 * time.Millisecond
	SuspicionMult  = 2
	GossipInterval = 50 * time.Millisecond
)

// MemberConfig describes one serf WAN member.
type MemberConfig struct {
	// Name is unique in the pool (coordinators: "<region>.<id>"); no "/" (memberlist reads "name/addr").
	Name string
	// Bind is host:port to listen on (UDP and TCP); port 0 picks one.
	Bind string
	// Advertise is host:port others use to reach this member (default Bind).
	Advertise string
	Tags      map[string]string
	Logger    *slog.Logger
	// Gossip encrypts the member's gossip (gossip.go); the zero value is
	// plain text. Every member of a pool needs a key of the pool's keyring.
	Gossip Gossip
}

// NewSerfConfig returns a fresh serf config (serf.Create mutates the
// memberlist config, so every instance needs its own) with the tuned
// timings and both log outputs routed to logger. With mc.Gossip it loads
// the keyring (Gossip.Load: it may read or write the keyring file) into
// MemberlistConfig.Keyring and sets KeyringFile, and logs where the keys
// came from on mc.Logger; MemberlistConfig.Keyring is nil for plain text.
// Errors name the flag (wan-bind, wan-advertise, gossip-key,
// gossip-keyring-file).
func NewSerfConfig(mc MemberConfig) (*serf.Config, error) {
	host, port, err := SplitHostPort(mc.Bind, "wan-bind")
	if err != nil {
		return nil, err
	}
	conf := serf.DefaultConfig()
	conf.NodeName = mc.Name
	conf.Tags = mc.Tags
	conf.ReconnectInterval = time.Second
	conf.ReconnectTimeout = time.Hour
	conf.TombstoneTimeout = time.Hour
	conf.ReapInterval = 5 * time.Second
	conf.BroadcastTimeout = time.Second
	ml := memberlist.DefaultLANConfig()
	ml.Name = mc.Name
	ml.BindAddr, ml.BindPort = host, port
	ml.AdvertiseAddr, ml.AdvertisePort = "", 0
	if mc.Advertise != "" {
		ah, ap, err := SplitHostPort(mc.Advertise, "wan-advertise")
		if err != nil {
			return nil, err
		}
		ml.AdvertiseAddr, ml.AdvertisePort = ah, ap
	}
	ml.ProbeInterval = ProbeInterval
	ml.ProbeTimeout = ProbeTimeout
	ml.SuspicionMult = SuspicionMult
	ml.GossipInterval = GossipInterval
	w := LogWriter(mc.Logger)
	conf.LogOutput = w
	ml.LogOutput = w
	conf.MemberlistConfig = ml
	kr, note, err := mc.Gossip.Load()
	if err != nil {
		return nil, err
	}
	if kr != nil {
		ml.Keyring = kr
		conf.KeyringFile = mc.Gossip.KeyringFile
		switch {
		case mc.Logger == nil:
		case mc.Gossip.Key != nil && !hasKey(kr.GetKeys(), mc.Gossip.Key):
			mc.Logger.Warn("gossip encrypted, but not with the given key", "keyring", note)
		default:
			mc.Logger.Info("gossip encrypted", "keyring", note)
		}
	}
	return conf, nil
}

// SplitHostPort parses a serf bind or advertise address (an empty host is
// 0.0.0.0, port 0..65535); errors name field and the rule.
func SplitHostPort(hp, field string) (string, int, error) {
	host, p, err := net.SplitHostPort(hp)
	if err != nil {
		return "", 0, fmt.Errorf("%s: %q must be host:port: %v", field, hp, err)
	}
	port, err := strconv.Atoi(p)
	if err != nil || port < 0 || port > 65535 {
		return "", 0, fmt.Errorf("%s: port of %q must be 0..65535", field, hp)
	}
	if host == "" {
		host = "0.0.0.0"
	}
	return host, port, nil
}

// LogWriter adapts serf's and memberlist's line logger to slog: [DEBUG]
// lines are dropped, [ERR] lines become Warn, the rest Info.
func LogWriter(l *slog.Logger) io.Writer {
	if l == nil {
		return io.Discard
	}
	return &logWriter{l: l}
}

type logWriter struct {
	mu  sync.Mutex
	buf bytes.Buffer
	l   *slog.Logger
}

func (w *logWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	for {
		line, err := w.buf.ReadString('\n')
		if err != nil {
			w.buf.WriteString(line)
			return len(p), nil
		}
		line = strings.TrimSpace(line)
		switch {
		case strings.Contains(line, "[DEBUG]"):
		case strings.Contains(line, "[ERR]"):
			w.l.Warn("serf", "msg", line)
		default:
			w.l.Info("serf", "msg", line)
		}
	}
}

// RejoinEvery is how often JoinLoop, after its first successful join,
// checks that every configured address is still an alive member and joins
// the missing ones again.
const RejoinEvery = 5 * time.Second

// JoinLoop joins the pool through addrs, retrying every second until one
// answers, and then, for as long as ctx lasts, rejoins every RejoinEvery any
// configured address that is not an alive member: serf does not reconnect to
// a member that left gracefully, so a router restarted without --wan-join
// would otherwise never see this member again. Joining an address that is
// already a member is harmless (a state exchange). It returns when ctx ends.
func JoinLoop(ctx context.Context, s *serf.Serf, addrs []string, log *slog.Logger) {
	if len(addrs) == 0 {
		return
	}
	wait := time.Second
	joined := false
	for ctx.Err() == nil {
		todo := addrs
		if joined {
			todo = notAlive(s, addrs)
		}
		if len(todo) > 0 {
			n, err := s.Join(todo, true)
			switch {
			case n > 0 && !joined:
				joined, wait = true, RejoinEvery
			case n > 0 && log != nil:
				log.Info("wan: rejoined members that had left the pool", "addrs", todo, "joined", n)
			case err != nil && log != nil:
				log.Debug("wan join failed; retrying", "addrs", todo, "err", err)
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(wait):
		}
	}
}

// notAlive returns the addresses (host:port) that no alive member of s
// listens on; a host that does not resolve counts as not alive.
func notAlive(s *serf.Serf, addrs []string) []string {
	alive := map[string]bool{}
	for _, m := range s.Members() {
		if m.Status == serf.StatusAlive {
			alive[net.JoinHostPort(m.Addr.String(), strconv.Itoa(int(m.Port)))] = true
		}
	}
	var out []string
	for _, a := range addrs {
		ta, err := net.ResolveTCPAddr("tcp", a)
		if err != nil || !alive[net.JoinHostPort(ta.IP.String(), strconv.Itoa(ta.Port))] {
			out = append(out, a)
		}
	}
	return out
}
