package regional

import (
	"context"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	apiarytest "apiary.dev/apiary/internal/testutil"
)

// A member that binds one address and advertises another (a name), as a
// StatefulSet pod does: it serves on the bound address, its clients reach it
// by the advertised name, and the cluster records the advertised URLs.
func TestEtcdListensApartFromWhatItAdvertises(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cport := strings.Split(apiarytest.FreeAddr(t), ":")[1]
	pport := strings.Split(apiarytest.FreeAddr(t), ":")[1]
	c := EtcdConfig{Name: "c1", DataDir: t.TempDir(),
		ClientURL: "http://localhost:" + cport, ListenClientURL: "http://127.0.0.1:" + cport,
		PeerURL: "http://localhost:" + pport, ListenPeerURL: "http://127.0.0.1:" + pport}
	if err := c.checkSchemes("http"); err != nil {
		t.Fatal(err)
	}
	startMember(t, ctx, c)
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{c.ClientURL}, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	if _, err := cli.Put(ctx, "k", "v"); err != nil {
		t.Fatalf("put through the advertised client URL: %v", err)
	}
	ml, err := cli.MemberList(ctx)
	if err != nil || len(ml.Members) != 1 {
		t.Fatalf("member list: %v %v", ml, err)
	}
	if m := ml.Members[0]; strings.Join(m.PeerURLs, ",") != c.PeerURL || strings.Join(m.ClientURLs, ",") != c.ClientURL {
		t.Errorf("member advertises peer %v, client %v; want %s and %s", m.PeerURLs, m.ClientURLs, c.PeerURL, c.ClientURL)
	}

	for _, bad := range []struct {
		mod  func(*EtcdConfig)
		want string
	}{
		{func(c *EtcdConfig) { c.ListenPeerURL = "http://c1.eu-west.svc:2380" }, "--etcd-listen-peer-url: \"http://c1.eu-west.svc:2380\" must name an IP address"},
		{func(c *EtcdConfig) { c.ListenClientURL = "https://0.0.0.0:2379" }, "--etcd-listen-client-url: \"https://0.0.0.0:2379\" must be a http:// URL"},
	} {
		cc := c
		bad.mod(&cc)
		if err := cc.checkSchemes("http"); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("checkSchemes: %v; want %q", err, bad.want)
		}
	}
}
