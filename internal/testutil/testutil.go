// Package testutil holds helpers shared by integration tests: building the
// apiary binary once per test binary, picking loopback ports, and waiting on
// conditions. It is imported only from _test.go files.
//
// Ports. Tests never bind port 0 and never pick from Linux's ephemeral port
// range (net.ipv4.ip_local_port_range, 32768-60999 by default): a port
// picked there and released may be taken by an outgoing connection before
// the process told to bind it does ("address already in use"). FreePort,
// FreeAddr and Listen hand out ports from 20000-31999 (package
// internal/devcluster/ports, which internal/devcluster uses too), skip ports
// in use over TCP or UDP, and reserve each port with a lock file under
// $TMPDIR/apiary-ports/ until the test binary exits, so test binaries that
// go test runs in parallel, and `apiary dev`, never get the same port.
package testutil

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"apiary.dev/apiary/internal/devcluster/ports"
)

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
	binDir    string
)

// Binary builds apiary.dev/apiary/cmd/apiary once and returns its path.
func Binary(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() {
		binDir, buildErr = os.MkdirTemp("", "apiary-bin-")
		if buildErr != nil {
			return
		}
		binPath = filepath.Join(binDir, "apiary")
		cmd := exec.Command("go", "build", "-o", binPath, "apiary.dev/apiary/cmd/apiary")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binPath
}

// Cleanup removes the built binary; call it from TestMain after m.Run.
func Cleanup() {
	if binDir != "" {
		os.RemoveAll(binDir)
	}
}

// FreePort returns a loopback port in 20000-31999 that was free a moment
// ago and is reserved for this test binary (see the package doc); for a
// process or server that is told its port before it binds it.
func FreePort(t testing.TB) int {
	t.Helper()
	ps, err := ports.Pick(1)
	if err != nil {
		t.Fatal(err)
	}
	return ps[0]
}

// FreeAddr is FreePort as "127.0.0.1:PORT".
func FreeAddr(t testing.TB) string {
	t.Helper()
	return fmt.Sprintf("127.0.0.1:%d", FreePort(t))
}

// Listen returns a TCP listener on 127.0.0.1 at a port in 20000-31999,
// closed when the test ends (closing it earlier is fine).
func Listen(t testing.TB) net.Listener {
	t.Helper()
	l, err := ports.Listen()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// Eventually polls cond every 25 ms until it returns nil or timeout passes,
// then fails the test with the last error.
func Eventually(t testing.TB, timeout time.Duration, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var last error
	for {
		if last = cond(); last == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not true after %s: %v", what, timeout, last)
		}
		time.Sleep(25 * time.Millisecond)
	}
}

// Expectation is what a malformed job file under
// internal/jobspec/testdata/malformed says about itself in its first line:
// "# expect: FIELD" (an error must name FIELD) or "# expect-message: TEXT"
// (the message must contain TEXT).
type Expectation struct {
	Field   string
	Message string
}

// Text is what the error output must contain: "FIELD: " or TEXT.
func (e Expectation) Text() string {
	if e.Field != "" {
		return e.Field + ": "
	}
	return e.Message
}

// ReadExpectation reads a malformed job file's expectation line; a file
// without one fails the test.
func ReadExpectation(t testing.TB, path string) Expectation {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	line, _ := bufio.NewReader(f).ReadString('\n')
	line = strings.TrimSpace(line)
	if v, ok := strings.CutPrefix(line, "# expect: "); ok {
		return Expectation{Field: v}
	}
	if v, ok := strings.CutPrefix(line, "# expect-message: "); ok {
		return Expectation{Message: v}
	}
	t.Fatalf("%s: first line must be '# expect: FIELD' or '# expect-message: TEXT', got %q", path, line)
	return Expectation{}
}

// ScrapeMetrics GETs a Prometheus /metrics URL and parses it (the test fails
// if it does not answer or does not parse), by metric family name.
func ScrapeMetrics(t testing.TB, url string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("%s does not parse: %v", url, err)
	}
	return fams
}

// MetricSum adds up the counter and gauge values of every series of a
// family (0 for a missing family).
func MetricSum(f *dto.MetricFamily) float64 {
	var v float64
	for _, m := range f.GetMetric() {
		v += m.GetCounter().GetValue() + m.GetGauge().GetValue()
	}
	return v
}

// LogBuffer is a goroutine-safe log sink (an slog handler's or a server's
// writer shared by its goroutines).
type LogBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *LogBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// String is everything written so far.
func (l *LogBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// Tail is the last n bytes written (all of them when fewer).
func (l *LogBuffer) Tail(n int) string {
	s := l.String()
	return s[max(0, len(s)-n):]
}
