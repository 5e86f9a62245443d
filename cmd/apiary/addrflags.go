package main

// The address flags of the server roles (region, global, agent), checked
// when the flags are parsed, before any part starts: a malformed address
// exits 2 naming the flag and the rule, instead of failing later in the
// part that binds or dials it (exit 3, or a member that never joins).
// What is only known at run time (a port already taken, a name that does
// not resolve) is still the part's failure.

import (
	"fmt"
	"net"
	"strconv"
	"strings"

	"apiary.dev/apiary/internal/cliconn"
	"apiary.dev/apiary/regional"
)

// portRule says which ports an address flag takes.
type portRule int

const (
	// listenPort: 0..65535, 0 picks a free port (a listener's own address).
	listenPort portRule = iota
	// dialPort: 1..65535 (an address others dial, or that this process
	// dials).
	dialPort
)

// checkHostPort refuses a value of flag that is not host:port with a
// numeric port the rule allows. A listener's host may be empty (every
// address, as ":7070"); an address to dial needs one.
func checkHostPort(flag, v string, rule portRule) error {
	host, port, err := net.SplitHostPort(v)
	if err != nil {
		return fmt.Errorf("--%s: %q must be host:port (%v)", flag, v, err)
	}
	if rule == dialPort && host == "" {
		return fmt.Errorf("--%s: %q has no host: give the name or address to dial, as host:port", flag, v)
	}
	return checkPort(flag, v, port, rule)
}

func checkPort(flag, v, port string, rule portRule) error {
	lo := 1
	if rule == listenPort {
		lo = 0
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < lo || n > 65535 {
		return fmt.Errorf("--%s: port of %q must be a number %d..65535, got %q", flag, v, lo, port)
	}
	return nil
}

// checkJoinList refuses an empty entry of a serf --wan-join list, or one
// whose port is not 1..65535 (serf joins host alone at its default port,
// 7946).
func checkJoinList(flag string, list []string) error {
	for _, a := range list {
		a = strings.TrimSpace(a)
		if a == "" {
			return fmt.Errorf("--%s: an empty address in the list (give host:port,host:port)", flag)
		}
		if !strings.Contains(a, ":") {
			continue // a host name or IPv4 address alone: serf's default port
		}
		if err := checkHostPort(flag, a, dialPort); err != nil {
			return err
		}
	}
	return nil
}

// addrFlag is one address flag's value and rule; an empty value is the
// flag's "off" and passes.
type addrFlag struct {
	flag string
	v    string
	rule portRule
}

func checkAddrFlags(fs ...addrFlag) error {
	for _, f := range fs {
		if f.v == "" {
			continue
		}
		if err := checkHostPort(f.flag, f.v, f.rule); err != nil {
			return withCode(exitInvalid, err)
		}
	}
	return nil
}

// checkRegionAddrs checks the address flags of `apiary region`: the API's
// --listen and --advertise, the serf --lan-addr and --wan-* addresses,
// --metrics-addr and --debug-addr, and every etcd URL (the member's
// advertised and listen URLs and --initial-cluster's, or --etcd-endpoints):
// scheme://host:port with a port 1..65535 (regional.CheckEtcdURL).
func checkRegionAddrs(cfg *regional.Config, metricsAddr, debugAddr string) error {
	if err := checkAdvertise(cfg.APIAddr, cfg.AdvertiseAddr); err != nil {
		return withCode(exitInvalid, err)
	}
	if err := checkAddrFlags(addrFlag{"listen", cfg.APIAddr, listenPort}, addrFlag{"lan-addr", cfg.LANAddr, listenPort},
		addrFlag{"wan-bind", cfg.WAN.Bind, listenPort}, addrFlag{"wan-advertise", cfg.WAN.Advertise, dialPort},
		addrFlag{"metrics-addr", metricsAddr, listenPort}, addrFlag{"debug-addr", debugAddr, listenPort}); err != nil {
		return err
	}
	if err := checkJoinList("wan-join", cfg.WAN.Join); err != nil {
		return withCode(exitInvalid, err)
	}
	if err := cfg.Etcd.CheckURLs(); err != nil {
		return withCode(exitInvalid, err)
	}
	return nil
}

// checkAgentAddrs checks the agent's --addr list (host:port, port
// 1..65535, as every client's), --lan-addr (unless "off") and
// --metrics-addr.
func checkAgentAddrs(addr, lanAddr, metricsAddr string) error {
	if _, err := cliconn.SplitAddrs(addr); err != nil {
		return withCode(exitInvalid, fmt.Errorf("--addr: %w", err))
	}
	if lanAddr == "off" {
		lanAddr = ""
	}
	return checkAddrFlags(addrFlag{"lan-addr", lanAddr, listenPort}, addrFlag{"metrics-addr", metricsAddr, listenPort})
}
