package router_test

import (
	"bytes"
	"os/exec"
	"regexp"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
)

// runAt runs the apiary binary against addr and returns stdout, stderr and
// the exit code.
func (f *fed) runAt(t *testing.T, addr string, args ...string) (string, string, int) {
	t.Helper()
	cmd := exec.Command(f.bin, append(args, "--addr", addr)...)
	cmd.Env = append(cmd.Environ(), "APIARY_ADDR=")
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return out.String(), errb.String(), code
}

// The router serves `node list` by asking every region; a coordinator serves
// `region list` from its WAN pool view; `region status` against the router
// exits 2 naming the coordinators to ask.
func TestCLIAdminCommandsAcrossRoles(t *testing.T) {
	f := startFed(t)

	out, errs, code := f.runAt(t, f.addr, "node", "list")
	t.Logf("node list through the router:\n%s%s", out, errs)
	if code != 0 || !regexp.MustCompile(`(?m)^eu-west\s+eu-n1\s+READY`).MatchString(out) ||
		!regexp.MustCompile(`(?m)^us-east\s+us-n1\s+READY`).MatchString(out) || errs != "" {
		t.Fatalf("node list through the router: exit %d", code)
	}
	out, _, code = f.runAt(t, f.addr, "node", "list", "-o", "json")
	var nodes apiaryv1.ListNodesResponse
	if err := protojson.Unmarshal([]byte(out), &nodes); err != nil || code != 0 || len(nodes.GetNodes()) != 2 ||
		nodes.GetNodes()[0].GetRegion() != "eu-west" || nodes.GetNodes()[1].GetRegion() != "us-east" {
		t.Fatalf("node list -o json: exit %d, %v\n%s", code, err, out)
	}

	// A coordinator in the WAN pool lists every region of the pool.
	out, errs, code = f.runAt(t, f.eu.APIAddrs[0], "region", "list")
	t.Logf("region list against an eu-west coordinator:\n%s%s", out, errs)
	if code != 0 || !regexp.MustCompile(`(?m)^eu-west\s+eu\s+up`).MatchString(out) ||
		!regexp.MustCompile(`(?m)^us-east\s+us\s+up`).MatchString(out) {
		t.Fatalf("region list against a coordinator: exit %d", code)
	}

	// region status is a coordinator's: the router says where to ask.
	out, errs, code = f.runAt(t, f.addr, "region", "status")
	t.Logf("region status against the router: exit %d\n%s%s", code, out, errs)
	if code != 2 || !strings.Contains(errs, "is a global router") ||
		!strings.Contains(errs, "apiary region status --addr "+f.eu.APIAddrs[0]+"   # eu-west") {
		t.Fatalf("region status against the router: exit %d", code)
	}

	// node quarantine and release through the router reach the region that
	// has the node; an unknown node is refused naming it.
	out, errs, code = f.runAt(t, f.addr, "node", "quarantine", "us-n1", "--reason", "flaky disk")
	if code != 0 || !strings.Contains(out, "node us-n1 quarantined since") {
		t.Fatalf("node quarantine through the router: exit %d\n%s%s", code, out, errs)
	}
	out, errs, code = f.runAt(t, f.addr, "node", "list")
	if code != 0 || !regexp.MustCompile(`(?m)^us-east\s+us-n1\s+READY.*QUARANTINED since .*: flaky disk`).MatchString(out) ||
		regexp.MustCompile(`(?m)^eu-west.*QUARANTINED`).MatchString(out) {
		t.Fatalf("node list after quarantining us-n1 through the router: exit %d\n%s%s", code, out, errs)
	}
	out, errs, code = f.runAt(t, f.addr, "node", "quarantine", "xx-n9", "--reason", "r")
	if code != 2 || !strings.Contains(errs, "node xx-n9: no such node in any region") {
		t.Fatalf("node quarantine of an unknown node through the router: exit %d\n%s%s", code, out, errs)
	}
	out, errs, code = f.runAt(t, f.addr, "node", "release", "us-n1")
	if code != 0 || !strings.Contains(out, "node us-n1 released") {
		t.Fatalf("node release through the router: exit %d\n%s%s", code, out, errs)
	}

	// A region that does not answer is named, and the others' nodes listed.
	if err := f.us.Coords[0].Kill(); err != nil {
		t.Fatal(err)
	}
	out, errs, code = f.runAt(t, f.addr, "node", "list")
	t.Logf("node list with us-east down:\n%s%s", out, errs)
	if code != 0 || !strings.Contains(out, "eu-n1") || strings.Contains(out, "us-n1") ||
		!strings.Contains(errs, "these regions did not answer, their nodes are missing: us-east") {
		t.Fatalf("node list with us-east down: exit %d", code)
	}
}
