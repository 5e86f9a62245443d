package telemetry

import (
	"io"
	"net/http"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// TestHealthzIsLivenessOnly: /healthz answers 200 "ok" from the metrics
// server alone, asking nothing of the process's other parts (here there
// are none: an empty registry), which is what a liveness probe needs
// (deploy/k8s). What the process can do is the gRPC health service's.
func TestHealthzIsLivenessOnly(t *testing.T) {
	s, err := Serve("127.0.0.1:0", prometheus.NewRegistry(), false)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	resp, err := http.Get("http://" + s.Addr() + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || string(body) != "ok\n" {
		t.Fatalf("/healthz: %s %q; want 200 \"ok\\n\"", resp.Status, body)
	}
}
