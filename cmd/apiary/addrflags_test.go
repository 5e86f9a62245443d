package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestServerAddressFlagsRefusedAtParse: a malformed address flag of a
// server role exits 2 at once, naming the flag and the rule, before any
// part starts (no data dir made, no port bound), where it used to fail
// later (exit 3 from the part that bound it) or be accepted (a non-numeric
// --advertise port).
func TestServerAddressFlagsRefusedAtParse(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		role string
		args []string
		want string
	}{
		{"region", []string{"--listen", "0.0.0.0:7070", "--advertise", "eu-west-1:abc"}, `--advertise: port of "eu-west-1:abc" must be a number 1..65535`},
		{"region", []string{"--advertise", "eu-west-1:70000"}, `--advertise: port of "eu-west-1:70000" must be a number 1..65535`},
		{"region", []string{"--advertise", "eu-west-1:0"}, `--advertise: port of "eu-west-1:0" must be a number 1..65535`},
		{"region", []string{"--etcd-listen-client-url", "http://0.0.0.0"}, `--etcd-listen-client-url: "http://0.0.0.0" has no port`},
		{"region", []string{"--etcd-listen-peer-url", "http://0.0.0.0:peer"}, `--etcd-listen-peer-url: "http://0.0.0.0:peer" must be an http:// or https:// URL, scheme://host:port`},
		{"region", []string{"--etcd-listen-peer-url", "http://0.0.0.0:99999"}, `--etcd-listen-peer-url: port of "http://0.0.0.0:99999" must be a number 1..65535`},
		{"region", []string{"--etcd-client-url", "http://127.0.0.1"}, `--etcd-client-url: "http://127.0.0.1" has no port`},
		{"region", []string{"--etcd-peer-url", "http://127.0.0.1:2380/x"}, `--etcd-peer-url: "http://127.0.0.1:2380/x" must be scheme://host:port`},
		{"region", []string{"--etcd-peer-url", "127.0.0.1:2380"}, `--etcd-peer-url: "127.0.0.1:2380" must be an http:// or https:// URL`},
		{"region", []string{"--etcd-client-url", "http://eu-west-1:2379"}, `--etcd-client-url: "http://eu-west-1:2379" must name an IP address to bind`},
		{"region", []string{"--id", "c1", "--initial-cluster", "c1=http://127.0.0.1:2380,c2=http://127.0.0.2"}, `--initial-cluster: "http://127.0.0.2" has no port`},
		{"region", []string{"--etcd-endpoints", "http://127.0.0.1"}, `--etcd-endpoints: "http://127.0.0.1" has no port`},
		{"region", []string{"--listen", "127.0.0.1:api"}, `--listen: port of "127.0.0.1:api" must be a number 0..65535`},
		{"region", []string{"--lan-addr", "10.0.0.1"}, `--lan-addr: "10.0.0.1" must be host:port`},
		{"region", []string{"--metrics-addr", "127.0.0.1:x"}, `--metrics-addr: port of "127.0.0.1:x" must be a number 0..65535`},
		{"region", []string{"--debug-addr", "localhost"}, `--debug-addr: "localhost" must be host:port`},
		{"region", []string{"--wan-bind", "10.0.0.1:99999"}, `--wan-bind: port of "10.0.0.1:99999" must be a number 0..65535`},
		{"region", []string{"--wan-join", "router-1:7946,:7946"}, `--wan-join: ":7946" has no host`},
		{"global", []string{"--listen", "127.0.0.1:router"}, `--listen: port of "127.0.0.1:router" must be a number 0..65535`},
		{"global", []string{"--wan-join", "10.0.0.1:0"}, `--wan-join: port of "10.0.0.1:0" must be a number 1..65535`},
		{"global", []string{"--wan-advertise", "10.0.0.1"}, `--wan-advertise: "10.0.0.1" must be host:port`},
		{"agent", []string{"--addr", "10.0.0.1:7070,10.0.0.2"}, `--addr: address "10.0.0.2": must be host:port`},
		{"agent", []string{"--addr", "10.0.0.1:7070", "--metrics-addr", "9100"}, `--metrics-addr: "9100" must be host:port`},
		{"agent", []string{"--addr", "10.0.0.1:7070", "--lan-addr", "10.0.0.1:lan"}, `--lan-addr: port of "10.0.0.1:lan" must be a number 0..65535`},
	} {
		data := filepath.Join(dir, "data")
		args := append([]string{tc.role, "--insecure-dev"}, tc.args...)
		if tc.role != "global" {
			args = append(args, "--data-dir", data)
		}
		r := runCLI(t, nil, args...)
		if r.code != exitInvalid || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("%s %v: exit %d, stderr %q; want exit %d with %q", tc.role, tc.args, r.code, r.stderr, exitInvalid, tc.want)
		}
		if r.took > 10*time.Second {
			t.Errorf("%s %v took %v; a flag check starts nothing", tc.role, tc.args, r.took)
		}
		if _, err := os.Stat(data); err == nil {
			t.Errorf("%s %v: made %s; nothing may start before the flags are checked", tc.role, tc.args, data)
			os.RemoveAll(data)
		}
	}
}

func TestCheckJoinList(t *testing.T) {
	for _, tc := range []struct {
		list []string
		err  string
	}{
		{[]string{"router-1:7946", "10.0.0.2", "[::1]:7946", "router-wan.apiary-global.svc.cluster.local:7946"}, ""},
		{[]string{""}, "an empty address"},
		{[]string{"a:b"}, `port of "a:b" must be a number 1..65535`},
		{[]string{"[::1]"}, "must be host:port"},
	} {
		err := checkJoinList("wan-join", tc.list)
		if (tc.err == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("checkJoinList(%q) = %v; want %q", tc.list, err, tc.err)
		}
	}
}
