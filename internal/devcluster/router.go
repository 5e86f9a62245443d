package devcluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"apiary.dev/apiary/internal/pki"
)

// RouterSpec describes a global router started on its own, at any time,
// apart from a Cluster (tests that start the router after the regions).
type RouterSpec struct {
	// Binary is the apiary executable; Dir holds the log and ready file.
	Binary string
	Dir    string
	// Name is the router's member name (default "global-1").
	Name string
	// WANBind is the serf host:port (default: a free port). Coordinators
	// whose --wan-join lists it find the router once it runs.
	WANBind string
	// Join is passed as --wan-join (empty: the router joins nobody and
	// waits to be joined).
	Join []string
	// ExtraArgs are appended to the `apiary global` command line.
	ExtraArgs []string
	// Env is added to the process's environment.
	Env []string
	// PKI, when set, gives the router a router certificate of id Name
	// (made if missing) and runs it with mutual TLS; nil runs it with
	// --insecure-dev.
	PKI *PKI
}

// StartRouter starts `apiary global` and waits until its ready file exists.
// It returns the process (the caller stops it with Proc.Stop) and its API
// address.
func StartRouter(ctx context.Context, spec RouterSpec) (*Proc, string, error) {
	if spec.Binary == "" {
		return nil, "", errors.New("devcluster: RouterSpec.Binary is required")
	}
	if spec.Name == "" {
		spec.Name = "global-1"
	}
	if err := os.MkdirAll(spec.Dir, 0o755); err != nil {
		return nil, "", err
	}
	ps, err := freePorts(2)
	if err != nil {
		return nil, "", err
	}
	addr := fmt.Sprintf("127.0.0.1:%d", ps[0])
	if spec.WANBind == "" {
		spec.WANBind = fmt.Sprintf("127.0.0.1:%d", ps[1])
	}
	ready := filepath.Join(spec.Dir, spec.Name+".ready")
	_ = os.Remove(ready)
	args := []string{"global", "--listen", addr, "--wan-bind", spec.WANBind, "--name", spec.Name, "--ready-file", ready}
	if len(spec.Join) > 0 {
		args = append(args, "--wan-join", strings.Join(spec.Join, ","))
	}
	targs, err := tlsArgs(spec.PKI, pki.RoleRouter, pki.GlobalRegion, spec.Name)
	if err != nil {
		return nil, "", err
	}
	args = append(args, targs...)
	args = append(args, spec.ExtraArgs...)
	p := &Proc{Name: spec.Name, Args: args, LogPath: filepath.Join(spec.Dir, spec.Name+".log"), env: spec.Env, bin: spec.Binary}
	if err := p.Start(); err != nil {
		return nil, "", err
	}
	if err := waitFor(ctx, 60*time.Second, func() error {
		if !p.Running() {
			return fmt.Errorf("%s exited; see %s", spec.Name, p.LogPath)
		}
		b, err := os.ReadFile(ready)
		if err != nil {
			return err
		}
		var r struct{ API string }
		return json.Unmarshal(b, &r) // written atomically: complete once it parses
	}); err != nil {
		_ = p.Kill()
		return nil, "", fmt.Errorf("router %s not ready: %w", spec.Name, err)
	}
	return p, addr, nil
}
