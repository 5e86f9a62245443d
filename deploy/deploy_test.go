// Package deploy_test checks the deployment files of deploy/ against the
// binary they run: the Kubernetes manifests decoded strictly into the
// k8s.io/api types (an unknown or misspelt field is an error, as kubectl
// apply --validate=strict would say), the systemd units and their flag
// files, and the Docker Compose file. Every flag these files pass must be one
// that `apiary <role> --help` lists, every port and name must agree between
// the objects that refer to each other, and the policy they mount must be
// deploy/policy.yaml. No cluster, systemd or Docker daemon is needed; where a
// tool is present (systemd-analyze, docker-compose), its own check runs too.
package deploy_test

import (
	"bytes"
	"cmp"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"maps"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"

	"apiary.dev/apiary/internal/testutil"
)

// roles are the subcommands a deployment file may start.
var roles = []string{"region", "global", "agent"}

var (
	flagsMu sync.Mutex
	flagSet = map[string]map[string]bool{}
)

// flagsOf lists the long flags `apiary <cmd...> --help` accepts.
func flagsOf(t *testing.T, cmd ...string) map[string]bool {
	t.Helper()
	key := strings.Join(cmd, " ")
	flagsMu.Lock()
	defer flagsMu.Unlock()
	if f := flagSet[key]; f != nil {
		return f
	}
	out, err := exec.Command(testutil.Binary(t), append(cmd, "--help")...).CombinedOutput()
	if err != nil {
		t.Fatalf("apiary %s --help: %v\n%s", key, err, out)
	}
	f := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^\s+(?:-\w, )?--([a-z0-9-]+)`).FindAllStringSubmatch(string(out), -1) {
		f[m[1]] = true
	}
	if len(f) < 3 {
		t.Fatalf("apiary %s --help lists %d flags; the parser missed them:\n%s", key, len(f), out)
	}
	flagSet[key] = f
	return f
}

// parseArgs splits --name=value arguments (the form every file here uses:
// one argument per flag, so nothing depends on a shell's word splitting).
func parseArgs(args []string) (map[string][]string, []string) {
	flags := map[string][]string{}
	var bad []string
	for _, a := range args {
		name, val, ok := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		if !strings.HasPrefix(a, "--") || !ok {
			bad = append(bad, a)
			continue
		}
		flags[name] = append(flags[name], val)
	}
	return flags, bad
}

// checkFlags reports the flags of cmd that `apiary <cmd[0]>` does not know.
func checkFlags(t *testing.T, where string, cmd []string) map[string][]string {
	t.Helper()
	if len(cmd) == 0 || !slices.Contains(append(slices.Clone(roles), "health"), cmd[0]) {
		t.Errorf("%s: starts %q; want one of %v or health", where, cmd, roles)
		return nil
	}
	known := flagsOf(t, cmd[0])
	flags, bad := parseArgs(cmd[1:])
	if len(bad) > 0 {
		t.Errorf("%s: %v are not --name=value arguments", where, bad)
	}
	for name := range flags {
		if !known[name] {
			t.Errorf("%s: apiary %s has no flag --%s", where, cmd[0], name)
		}
	}
	return flags
}

func portOf(t *testing.T, where, hostport string) int32 {
	t.Helper()
	if u, err := url.Parse(hostport); err == nil && u.Scheme != "" && u.Host != "" {
		hostport = u.Host
	}
	_, p, err := net.SplitHostPort(hostport)
	n, err2 := strconv.Atoi(p)
	if err != nil || err2 != nil {
		t.Errorf("%s: %q has no port", where, hostport)
	}
	return int32(n)
}

// ---- Kubernetes ----

type kustomization struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Namespace  string `json:"namespace"`
	Labels     []struct {
		Pairs            map[string]string `json:"pairs"`
		IncludeSelectors bool              `json:"includeSelectors,omitempty"`
	} `json:"labels"`
	Resources []string `json:"resources"`
	Images    []struct {
		Name    string `json:"name"`
		NewName string `json:"newName,omitempty"`
		NewTag  string `json:"newTag,omitempty"`
	} `json:"images"`
}

// manifestSet is one kustomization's objects, decoded.
type manifestSet struct {
	dir        string
	k          kustomization
	namespaces []*corev1.Namespace
	configMaps []*corev1.ConfigMap
	services   []*corev1.Service
	sts        []*appsv1.StatefulSet
	deps       []*appsv1.Deployment
	dss        []*appsv1.DaemonSet
	pdbs       []*policyv1.PodDisruptionBudget
	issuers    []*certManagerIssuer
}

// certManagerIssuer is the part of cert-manager's Issuer
// (cert-manager.io/v1; its types are not in k8s.io/api) that these
// manifests use: a CA issuer signing with the key pair of a Secret. It is
// decoded strictly like the rest, so a field that is not here is an error:
// add it (as cert-manager's API reference spells it) before using it.
type certManagerIssuer struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		CA *struct {
			SecretName string `json:"secretName"`
		} `json:"ca"`
	} `json:"spec"`
}

// The CSI driver's volume attributes that name the issuer
// (cert-manager's csi-driver; kind and group default to Issuer and
// cert-manager.io).
const (
	csiDriver      = "csi.cert-manager.io"
	csiIssuerName  = "csi.cert-manager.io/issuer-name"
	csiIssuerKind  = "csi.cert-manager.io/issuer-kind"
	csiIssuerGroup = "csi.cert-manager.io/issuer-group"
)

// workload is a pod template with where it came from.
type workload struct {
	name     string
	selector *metav1.LabelSelector
	tmpl     *corev1.PodTemplateSpec
	claims   []corev1.PersistentVolumeClaim
}

func (s *manifestSet) workloads() []workload {
	var out []workload
	for _, o := range s.sts {
		out = append(out, workload{"StatefulSet/" + o.Name, o.Spec.Selector, &o.Spec.Template, o.Spec.VolumeClaimTemplates})
	}
	for _, o := range s.deps {
		out = append(out, workload{"Deployment/" + o.Name, o.Spec.Selector, &o.Spec.Template, nil})
	}
	for _, o := range s.dss {
		out = append(out, workload{"DaemonSet/" + o.Name, o.Spec.Selector, &o.Spec.Template, nil})
	}
	return out
}

// strict decodes doc into v, refusing unknown fields (sigs.k8s.io/yaml:
// YAML to JSON, then encoding/json with DisallowUnknownFields).
func strict(doc []byte, v any) error { return yaml.UnmarshalStrict(doc, v) }

func loadManifests(t *testing.T, dir string) *manifestSet {
	t.Helper()
	s := &manifestSet{dir: dir}
	b, err := os.ReadFile(filepath.Join(dir, "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := strict(b, &s.k); err != nil {
		t.Fatalf("%s/kustomization.yaml: %v", dir, err)
	}
	if s.k.APIVersion != "kustomize.config.k8s.io/v1beta1" || s.k.Kind != "Kustomization" || s.k.Namespace == "" || len(s.k.Resources) == 0 {
		t.Fatalf("%s/kustomization.yaml: %+v; want a v1beta1 Kustomization with a namespace and resources", dir, s.k)
	}
	files, _ := filepath.Glob(filepath.Join(dir, "*.yaml"))
	for _, f := range files {
		if base := filepath.Base(f); base != "kustomization.yaml" && !slices.Contains(s.k.Resources, base) {
			t.Errorf("%s: not listed in kustomization.yaml resources", f)
		}
	}
	for _, r := range s.k.Resources {
		raw, err := os.ReadFile(filepath.Join(dir, r))
		if err != nil {
			t.Fatalf("%s: resource %s: %v", dir, r, err)
		}
		for i, doc := range bytes.Split(append([]byte("\n"), raw...), []byte("\n---\n")) {
			if len(bytes.TrimSpace(regexp.MustCompile(`(?m)^#.*$`).ReplaceAll(doc, nil))) == 0 {
				continue
			}
			where := fmt.Sprintf("%s/%s document %d", dir, r, i+1)
			var tm metav1.TypeMeta
			if err := yaml.Unmarshal(doc, &tm); err != nil {
				t.Fatalf("%s: %v", where, err)
			}
			var obj interface{ GetNamespace() string }
			switch tm.APIVersion + " " + tm.Kind {
			case "v1 Namespace":
				o := &corev1.Namespace{}
				s.namespaces, obj = append(s.namespaces, o), o
			case "v1 ConfigMap":
				o := &corev1.ConfigMap{}
				s.configMaps, obj = append(s.configMaps, o), o
			case "v1 Service":
				o := &corev1.Service{}
				s.services, obj = append(s.services, o), o
			case "apps/v1 StatefulSet":
				o := &appsv1.StatefulSet{}
				s.sts, obj = append(s.sts, o), o
			case "apps/v1 Deployment":
				o := &appsv1.Deployment{}
				s.deps, obj = append(s.deps, o), o
			case "apps/v1 DaemonSet":
				o := &appsv1.DaemonSet{}
				s.dss, obj = append(s.dss, o), o
			case "policy/v1 PodDisruptionBudget":
				o := &policyv1.PodDisruptionBudget{}
				s.pdbs, obj = append(s.pdbs, o), o
			case "cert-manager.io/v1 Issuer":
				o := &certManagerIssuer{}
				s.issuers, obj = append(s.issuers, o), o
			default:
				t.Errorf("%s: %s %s is no kind this test knows; add it", where, tm.APIVersion, tm.Kind)
				continue
			}
			if err := strict(doc, obj); err != nil {
				t.Errorf("%s (%s): %v", where, tm.Kind, err)
				continue
			}
			if tm.Kind != "Namespace" && obj.GetNamespace() != s.k.Namespace {
				t.Errorf("%s: namespace %q; want the kustomization's %q", where, obj.GetNamespace(), s.k.Namespace)
			}
		}
	}
	return s
}

func matches(sel map[string]string, labels map[string]string) bool {
	if len(sel) == 0 {
		return false
	}
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return true
}

func TestKubernetesManifests(t *testing.T) {
	dirs, _ := filepath.Glob("k8s/*/kustomization.yaml")
	if len(dirs) != 3 {
		t.Fatalf("kustomizations %v; want eu-west, us-east and global", dirs)
	}
	policy, err := os.ReadFile("policy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile("k8s/README.md")
	if err != nil {
		t.Fatal(err)
	}
	sawRole := map[string]bool{}
	for _, k := range dirs {
		s := loadManifests(t, filepath.Dir(k))
		if len(s.namespaces) != 1 || s.namespaces[0].Name != s.k.Namespace {
			t.Errorf("%s: want one Namespace, %s", s.dir, s.k.Namespace)
		}
		if len(s.configMaps) != 1 || s.configMaps[0].Name != "apiary-policy" || s.configMaps[0].Data["policy.yaml"] != string(policy) {
			t.Errorf("%s: want ConfigMap apiary-policy holding deploy/policy.yaml byte for byte", s.dir)
		}
		wls := s.workloads()
		for _, w := range wls {
			checkWorkload(t, s, w, sawRole)
		}
		checkIssuers(t, s, wls, string(readme))
		for _, svc := range s.services {
			var target *workload
			for i := range wls {
				if matches(svc.Spec.Selector, wls[i].tmpl.Labels) {
					target = &wls[i]
				}
			}
			if target == nil {
				t.Errorf("%s: Service %s selects no pod template (%v)", s.dir, svc.Name, svc.Spec.Selector)
				continue
			}
			for _, p := range svc.Spec.Ports {
				if p.TargetPort.Type != intstr.String || !hasPort(target.tmpl, p.TargetPort.StrVal, p.Protocol) {
					t.Errorf("%s: Service %s port %s targets %v, no named %s port of %s", s.dir, svc.Name, p.Name, p.TargetPort.String(), proto(p.Protocol), target.name)
				}
			}
		}
		for _, o := range s.sts {
			var headless *corev1.Service
			for _, svc := range s.services {
				if svc.Name == o.Spec.ServiceName {
					headless = svc
				}
			}
			if headless == nil || headless.Spec.ClusterIP != corev1.ClusterIPNone || !headless.Spec.PublishNotReadyAddresses {
				t.Errorf("%s: StatefulSet %s's serviceName %q is no headless Service publishing not-ready addresses", s.dir, o.Name, o.Spec.ServiceName)
			}
			if o.Spec.PodManagementPolicy != appsv1.ParallelPodManagement {
				t.Errorf("%s: StatefulSet %s: podManagementPolicy %q; want Parallel (etcd members need each other to become ready)", s.dir, o.Name, o.Spec.PodManagementPolicy)
			}
			if !antiAffinityOver(o.Spec.Template.Spec.Affinity, "topology.kubernetes.io/zone") || !antiAffinityOver(o.Spec.Template.Spec.Affinity, "kubernetes.io/hostname") {
				t.Errorf("%s: StatefulSet %s: want pod anti-affinity across nodes and zones", s.dir, o.Name)
			}
			var pdb *policyv1.PodDisruptionBudget
			for _, p := range s.pdbs {
				if p.Spec.Selector != nil && matches(p.Spec.Selector.MatchLabels, o.Spec.Template.Labels) {
					pdb = p
				}
			}
			if replicas := *o.Spec.Replicas; pdb == nil || pdb.Spec.MinAvailable == nil || pdb.Spec.MinAvailable.IntValue() != int(replicas/2+1) {
				t.Errorf("%s: StatefulSet %s: want a PodDisruptionBudget keeping a quorum (minAvailable %d)", s.dir, o.Name, replicas/2+1)
			}
			checkInitialCluster(t, s, o)
		}
	}
	for _, r := range roles {
		if !sawRole[r] {
			t.Errorf("no manifest runs apiary %s", r)
		}
	}
}

// checkIssuers: every cert-manager issuer a workload refers to (a
// csi.cert-manager.io volume's issuer-name, -kind and -group) is an Issuer
// of the same kustomization (an Issuer is namespaced: the pod's namespace);
// every Issuer provided is a CA issuer whose Secret the README tells the
// operator to create in that namespace (nothing here can hold the CA key).
func checkIssuers(t *testing.T, s *manifestSet, wls []workload, readme string) {
	provided := map[string]*certManagerIssuer{}
	for _, is := range s.issuers {
		provided[is.Name] = is
		where := s.dir + ": Issuer " + is.Name
		if is.Spec.CA == nil || is.Spec.CA.SecretName == "" {
			t.Errorf("%s: want a CA issuer (spec.ca.secretName): Apiary's certificates are signed by Apiary's CA", where)
			continue
		}
		if want := "create secret tls " + is.Spec.CA.SecretName; !strings.Contains(readme, want) {
			t.Errorf("%s: its Secret %s is made by nothing: k8s/README.md must tell the operator to run kubectl -n %s %s",
				where, is.Spec.CA.SecretName, s.k.Namespace, want)
		}
	}
	for _, w := range wls {
		for _, v := range w.tmpl.Spec.Volumes {
			if v.CSI == nil || v.CSI.Driver != csiDriver {
				continue
			}
			where := fmt.Sprintf("%s: %s volume %s", s.dir, w.name, v.Name)
			a := v.CSI.VolumeAttributes
			name, kind, group := a[csiIssuerName], cmp.Or(a[csiIssuerKind], "Issuer"), cmp.Or(a[csiIssuerGroup], "cert-manager.io")
			switch {
			case name == "":
				t.Errorf("%s: no %s", where, csiIssuerName)
			case kind != "Issuer" || group != "cert-manager.io":
				t.Errorf("%s: issuer %s of kind %s (group %s); this kustomization provides Issuers (cert-manager.io) only", where, name, kind, group)
			case provided[name] == nil:
				t.Errorf("%s: names the Issuer %s, which the kustomization does not provide (it has %v)", where, name, slices.Sorted(maps.Keys(provided)))
			}
		}
	}
}

func proto(p corev1.Protocol) corev1.Protocol {
	if p == "" {
		return corev1.ProtocolTCP
	}
	return p
}

func hasPort(tmpl *corev1.PodTemplateSpec, name string, p corev1.Protocol) bool {
	for _, c := range tmpl.Spec.Containers {
		for _, cp := range c.Ports {
			if cp.Name == name && proto(cp.Protocol) == proto(p) {
				return true
			}
		}
	}
	return false
}

func containerPort(c corev1.Container, name string) int32 {
	for _, cp := range c.Ports {
		if cp.Name == name {
			return cp.ContainerPort
		}
	}
	return 0
}

func antiAffinityOver(a *corev1.Affinity, key string) bool {
	if a == nil || a.PodAntiAffinity == nil {
		return false
	}
	for _, term := range a.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution {
		if term.TopologyKey == key {
			return true
		}
	}
	for _, w := range a.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution {
		if w.PodAffinityTerm.TopologyKey == key {
			return true
		}
	}
	return false
}

var envRef = regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)

func checkWorkload(t *testing.T, s *manifestSet, w workload, sawRole map[string]bool) {
	where := s.dir + ": " + w.name
	if w.selector == nil || !matches(w.selector.MatchLabels, w.tmpl.Labels) {
		t.Errorf("%s: selector %v does not match its pod template's labels %v", where, w.selector, w.tmpl.Labels)
	}
	vols := map[string]bool{}
	for _, v := range w.tmpl.Spec.Volumes {
		vols[v.Name] = true
		if v.ConfigMap != nil && !slices.ContainsFunc(s.configMaps, func(c *corev1.ConfigMap) bool { return c.Name == v.ConfigMap.Name }) {
			t.Errorf("%s: volume %s: ConfigMap %s is not in the kustomization", where, v.Name, v.ConfigMap.Name)
		}
	}
	for _, c := range w.claims {
		vols[c.Name] = true
	}
	for _, c := range w.tmpl.Spec.Containers {
		cw := where + " container " + c.Name
		sawRole[c.Args[0]] = true
		if len(c.Command) != 0 {
			t.Errorf("%s: command %v; the image's entrypoint is /apiary, give args only", cw, c.Command)
		}
		flags := checkFlags(t, cw, c.Args)
		env := map[string]bool{}
		for _, e := range c.Env {
			env[e.Name] = true
		}
		for _, a := range c.Args {
			for _, m := range envRef.FindAllStringSubmatch(a, -1) {
				if !env[m[1]] {
					t.Errorf("%s: %s refers to $(%s), which the container's env does not define", cw, a, m[1])
				}
			}
		}
		if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() {
			t.Errorf("%s: want cpu and memory requests", cw)
		}
		var mounts []string
		for _, m := range c.VolumeMounts {
			if !vols[m.Name] {
				t.Errorf("%s: mount %s names no volume", cw, m.Name)
			}
			mounts = append(mounts, m.MountPath)
		}
		under := func(path string) bool {
			return slices.ContainsFunc(mounts, func(m string) bool { return strings.HasPrefix(path, m+"/") })
		}
		for _, f := range []string{"tls-ca", "tls-cert", "tls-key", "policy"} {
			for _, p := range flags[f] {
				if !under(p) {
					t.Errorf("%s: --%s=%s is under no volume mount %v", cw, f, p, mounts)
				}
			}
		}
		if d := flags["data-dir"]; c.Args[0] != "global" && (len(d) != 1 || !slices.Contains(mounts, d[0])) {
			t.Errorf("%s: --data-dir %v is not a volume mount %v", cw, d, mounts)
		}
		if l := flags["listen"]; len(l) == 1 {
			if p := portOf(t, cw, l[0]); p != containerPort(c, "api") {
				t.Errorf("%s: --listen port %d; the container port named api is %d", cw, p, containerPort(c, "api"))
			}
		}
		if m := flags["metrics-addr"]; len(m) == 1 && portOf(t, cw, m[0]) != containerPort(c, "metrics") {
			t.Errorf("%s: --metrics-addr port; the container port named metrics is %d", cw, containerPort(c, "metrics"))
		}
		for f, port := range map[string]string{"etcd-listen-peer-url": "etcd-peer", "etcd-listen-client-url": "etcd-client", "wan-bind": "wan"} {
			if v := flags[f]; len(v) == 1 && portOf(t, cw, v[0]) != containerPort(c, port) {
				t.Errorf("%s: --%s=%s; the container port named %s is %d", cw, f, v[0], port, containerPort(c, port))
			}
		}
		probes := map[string]*corev1.Probe{"startup": c.StartupProbe, "readiness": c.ReadinessProbe, "liveness": c.LivenessProbe}
		if c.LivenessProbe == nil {
			t.Errorf("%s: no liveness probe", cw)
		}
		for kind, p := range probes {
			if p == nil {
				continue
			}
			pw := cw + " " + kind + " probe"
			if p.Exec == nil || len(p.Exec.Command) < 2 || p.Exec.Command[0] != "/apiary" || p.Exec.Command[1] != "health" {
				t.Errorf("%s: want exec /apiary health (the image has no shell)", pw)
				continue
			}
			if strings.Contains(strings.Join(p.Exec.Command, " "), "$(") {
				t.Errorf("%s: %v: Kubernetes expands $(VAR) in args, never in a probe's command", pw, p.Exec.Command)
			}
			pf := checkFlags(t, pw, p.Exec.Command[1:])
			if a := pf["addr"]; len(a) == 1 && portOf(t, pw, a[0]) != containerPort(c, "api") {
				t.Errorf("%s: --addr %s is not the api port %d", pw, a[0], containerPort(c, "api"))
			}
			if h := pf["http"]; len(h) == 1 && portOf(t, pw, h[0]) != containerPort(c, "metrics") {
				t.Errorf("%s: --http %s is not the metrics port %d", pw, h[0], containerPort(c, "metrics"))
			}
			for _, f := range []string{"tls-ca", "tls-cert", "tls-key"} {
				for _, v := range pf[f] {
					if !under(v) {
						t.Errorf("%s: --%s=%s is under no volume mount", pw, f, v)
					}
				}
			}
		}
		checkProbeRoles(t, cw, c, flags)
	}
}

// checkProbeRoles: a probe whose failure makes kubelet restart the
// container (liveness, and startup, which gates it and restarts too) may
// only ask whether the process runs: apiary health
// --http=http://127.0.0.1:<metrics port>/healthz, which answers while the
// process serves HTTP. The gRPC health check (apiary health --addr) says
// NOT_SERVING while a coordinator's reads of its region's etcd fail; as a
// liveness probe it would restart every healthy member of a region that
// lost its quorum, making the outage worse. That check is readiness: a
// container serving an API (a port named api) needs a readiness probe
// running it on that port, so that its Services send only to members that
// serve.
func checkProbeRoles(t *testing.T, cw string, c corev1.Container, flags map[string][]string) {
	metrics := containerPort(c, "metrics")
	for kind, p := range map[string]*corev1.Probe{"liveness": c.LivenessProbe, "startup": c.StartupProbe} {
		if p == nil || p.Exec == nil || len(p.Exec.Command) < 2 {
			continue // reported above
		}
		pf, _ := parseArgs(p.Exec.Command[2:])
		want := fmt.Sprintf("http://127.0.0.1:%d/healthz", metrics)
		if len(pf["addr"]) > 0 || len(pf["service"]) > 0 {
			t.Errorf("%s %s probe: %v runs the gRPC serving check, which fails while the process is alive (a coordinator cut off from its "+
				"etcd quorum says NOT_SERVING): kubelet would restart healthy members of a region that lost its quorum; "+
				"a %s probe must ask only whether the process runs: --http=%s", cw, kind, p.Exec.Command, kind, want)
			continue
		}
		if h := pf["http"]; len(h) != 1 || h[0] != want || metrics == 0 {
			t.Errorf("%s %s probe: %v; want apiary health --http=%s (the process's /healthz on its metrics port)", cw, kind, p.Exec.Command, want)
		}
		if m := flags["metrics-addr"]; len(m) != 1 || !slices.Contains([]string{"0.0.0.0", "127.0.0.1", ""}, strings.Split(m[0], ":")[0]) {
			t.Errorf("%s %s probe: /healthz needs --metrics-addr on 0.0.0.0 or 127.0.0.1, got %v", cw, kind, m)
		}
	}
	if api := containerPort(c, "api"); api != 0 {
		p := c.ReadinessProbe
		var pf map[string][]string
		if p != nil && p.Exec != nil && len(p.Exec.Command) >= 2 {
			pf, _ = parseArgs(p.Exec.Command[2:])
		}
		if a := pf["addr"]; len(a) != 1 || a[0] != fmt.Sprintf("127.0.0.1:%d", api) || len(pf["http"]) > 0 {
			t.Errorf("%s: serves an API on port %d; want a readiness probe running apiary health --addr=127.0.0.1:%d (gRPC health: "+
				"its Services then send only to serving members)", cw, api, api)
		}
	}
}

// checkInitialCluster: every member of --initial-cluster is a pod of the
// StatefulSet, named <sts>-<i> and reached at its stable DNS name, and the
// member's own advertised URLs are that name.
func checkInitialCluster(t *testing.T, s *manifestSet, o *appsv1.StatefulSet) {
	where := s.dir + ": StatefulSet " + o.Name
	flags, _ := parseArgs(o.Spec.Template.Spec.Containers[0].Args[1:])
	ic := flags["initial-cluster"]
	if len(ic) != 1 {
		t.Errorf("%s: want one --initial-cluster", where)
		return
	}
	members := strings.Split(ic[0], ",")
	if len(members) != int(*o.Spec.Replicas) {
		t.Errorf("%s: --initial-cluster has %d members; replicas %d", where, len(members), *o.Spec.Replicas)
	}
	for i, m := range members {
		name, u, _ := strings.Cut(m, "=")
		want := fmt.Sprintf("%s-%d", o.Name, i)
		host := fmt.Sprintf("%s.%s.%s.svc.cluster.local", want, o.Spec.ServiceName, s.k.Namespace)
		if name != want || u != "https://"+host+":2380" {
			t.Errorf("%s: member %q; want %s=https://%s:2380", where, m, want, host)
		}
	}
	stable := fmt.Sprintf("$(POD_NAME).%s.%s.svc.cluster.local", o.Spec.ServiceName, s.k.Namespace)
	for f, want := range map[string]string{"id": "$(POD_NAME)", "etcd-peer-url": "https://" + stable + ":2380",
		"etcd-client-url": "https://" + stable + ":2379", "advertise": stable + ":7070"} {
		if v := flags[f]; len(v) != 1 || v[0] != want {
			t.Errorf("%s: --%s %v; want %s", where, f, v, want)
		}
	}
}

// ---- systemd ----

// TestSystemdUnits checks each unit's flag file against its role's flags
// (the files use "--name value", word-split by systemd) and, where
// systemd-analyze is installed, verifies the units with it.
func TestSystemdUnits(t *testing.T) {
	for _, u := range []struct{ unit, env, role, variable string }{
		{"apiary-region.service", "region.env", "region", "APIARY_REGION_FLAGS"},
		{"apiary-router.service", "router.env", "global", "APIARY_ROUTER_FLAGS"},
		{"apiary-agent.service", "agent.env", "agent", "APIARY_AGENT_FLAGS"},
	} {
		unit, err := os.ReadFile(filepath.Join("systemd", u.unit))
		if err != nil {
			t.Fatal(err)
		}
		if want := "ExecStart=/usr/local/bin/apiary " + u.role + " $" + u.variable + "\n"; !strings.Contains(string(unit), want) {
			t.Errorf("%s: want the line %q", u.unit, want)
		}
		if !strings.Contains(string(unit), "EnvironmentFile=/etc/apiary/"+u.env+"\n") {
			t.Errorf("%s: want EnvironmentFile=/etc/apiary/%s", u.unit, u.env)
		}
		env, err := os.ReadFile(filepath.Join("systemd", u.env))
		if err != nil {
			t.Fatal(err)
		}
		var line string
		for _, l := range strings.Split(string(env), "\n") {
			if v, ok := strings.CutPrefix(l, u.variable+"="); ok {
				line = v
			}
		}
		words := strings.Fields(line)
		if len(words) == 0 {
			t.Errorf("%s: no %s=", u.env, u.variable)
		}
		known := flagsOf(t, u.role)
		for i := 0; i < len(words); i++ {
			name, ok := strings.CutPrefix(words[i], "--")
			if !ok || strings.Contains(name, "=") || strings.ContainsAny(words[i], `"'`) {
				t.Errorf("%s: %q: want --name value pairs without quotes (systemd splits at whitespace)", u.env, words[i])
				continue
			}
			if !known[name] {
				t.Errorf("%s: apiary %s has no flag --%s", u.env, u.role, name)
			}
			if i+1 < len(words) && !strings.HasPrefix(words[i+1], "--") {
				i++
			}
		}
		if !strings.Contains(string(unit), "\nRestartPreventExitStatus=2\n") {
			t.Errorf("%s: want RestartPreventExitStatus=2: exit 2 is a configuration error, which restarting every 2 s cannot fix", u.unit)
		}
		checkShippedGossipKey(t, u.env, u.role, string(env))
		if u.role == "agent" {
			for _, want := range []string{"KillMode=process\n", "Delegate=yes\n"} {
				if !strings.Contains(string(unit), want) {
					t.Errorf("%s: want %s (the agent stops its own tasks)", u.unit, strings.TrimSpace(want))
				}
			}
			for _, bad := range []string{"ProtectControlGroups=yes", "ProtectKernelTunables=yes", "PrivateUsers=yes"} {
				if strings.Contains(string(unit), bad) {
					t.Errorf("%s: %s would stop the agent from making task cgroups or users", u.unit, bad)
				}
			}
		}
	}
	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Log("systemd-analyze not installed: the units' own syntax check is skipped")
		return
	}
	// The units name /usr/local/bin/apiary and /etc/apiary/*.env; verify
	// copies that name the test's binary and optional env files.
	dir := t.TempDir()
	var paths []string
	for _, u := range []string{"apiary-region.service", "apiary-router.service", "apiary-agent.service"} {
		b, _ := os.ReadFile(filepath.Join("systemd", u))
		b = bytes.ReplaceAll(b, []byte("/usr/local/bin/apiary"), []byte(testutil.Binary(t)))
		b = bytes.ReplaceAll(b, []byte("EnvironmentFile=/etc/apiary/"), []byte("EnvironmentFile=-"+dir+"/"))
		p := filepath.Join(dir, u)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		paths = append(paths, p)
	}
	out, err := exec.Command(analyze, append([]string{"verify"}, paths...)...).CombinedOutput()
	if err != nil || len(bytes.TrimSpace(out)) > 0 {
		t.Errorf("systemd-analyze verify: %v\n%s", err, out)
	}
}

// checkShippedGossipKey: the example env file ships no usable gossip key
// (every federation needs its own), and what it ships, or a placeholder an
// operator might leave in, stops the process at start with exit 2 and a
// message naming the variable and how to make a key, before anything
// starts (run with the role's defaults, --insecure-dev and an empty data
// dir, which must stay absent).
func checkShippedGossipKey(t *testing.T, file, role, env string) {
	t.Helper()
	shipped, ok := "", false
	for _, l := range strings.Split(env, "\n") {
		if v, found := strings.CutPrefix(l, "APIARY_GOSSIP_KEY="); found {
			shipped, ok = v, true
		}
	}
	if !ok {
		t.Errorf("%s: no APIARY_GOSSIP_KEY= line (the unit's gossip key)", file)
		return
	}
	for _, key := range []string{shipped, "AAAAAAAAAAAAAAAAAAAAAA==", "REPLACE-ME"} {
		data := filepath.Join(t.TempDir(), "data")
		args := []string{role, "--insecure-dev"}
		if role != "global" {
			args = append(args, "--data-dir", data)
		}
		cmd := exec.Command(testutil.Binary(t), args...)
		cmd.Env = append(os.Environ(), "APIARY_GOSSIP_KEY="+key)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		var err error
		select {
		case err = <-done:
		case <-time.After(20 * time.Second):
			cmd.Process.Kill()
			<-done
			t.Errorf("%s: apiary %s with APIARY_GOSSIP_KEY=%q still runs after 20 s; want exit 2 at start", file, role, key)
			continue
		}
		ee, isExit := err.(*exec.ExitError)
		if !isExit || ee.ExitCode() != 2 || !strings.Contains(out.String(), "$APIARY_GOSSIP_KEY") || !strings.Contains(out.String(), "apiary keygen") {
			t.Errorf("%s: apiary %s with APIARY_GOSSIP_KEY=%q: %v\n%s\nwant exit 2 naming $APIARY_GOSSIP_KEY and apiary keygen", file, role, key, err, out.String())
		}
		if _, err := os.Stat(data); err == nil {
			t.Errorf("%s: apiary %s with APIARY_GOSSIP_KEY=%q made its data dir; nothing may start before the key is checked", file, role, key)
		}
	}
}

// ---- Docker Compose ----

// TestComposeFile checks every service's command and health check against
// the binary's flags, that each TLS file a service names is mounted into it
// and made by certs.sh, and, where docker-compose is installed, that it
// accepts the file.
func TestComposeFile(t *testing.T) {
	b, err := os.ReadFile("compose/docker-compose.yml")
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Services map[string]struct {
			Command     []string `json:"command"`
			Volumes     []string `json:"volumes"`
			Healthcheck struct {
				Test []string `json:"test"`
			} `json:"healthcheck"`
			Ports  []string `json:"ports"`
			Deploy any      `json:"deploy"`
			Labels any      `json:"labels"`
		} `json:"services"`
	}
	// Every host file under tls/ comes from the directory of the network
	// prefix, the one certs.sh makes for it (TestComposeCertsKeyedByPrefix).
	keyed := "tls/${APIARY_NET_PREFIX:-10.97}/"
	for _, m := range regexp.MustCompile(`(?m)^\s*(?:- |env_file: )(\./)?tls/.*$`).FindAllString(string(b), -1) {
		if !strings.Contains(m, keyed) {
			t.Errorf("compose file: %q: want every certificate and key from %s (their IPs are the prefix's)", strings.TrimSpace(m), keyed)
		}
	}
	b = bytes.ReplaceAll(b, []byte("${APIARY_NET_PREFIX:-10.97}"), []byte("10.97"))
	if err := yaml.Unmarshal(b, &f); err != nil {
		t.Fatal(err)
	}
	certs, err := os.ReadFile("compose/certs.sh")
	if err != nil {
		t.Fatal(err)
	}
	count := map[string]int{}
	for name, svc := range f.Services {
		where := "compose service " + name
		if len(svc.Command) == 0 {
			t.Errorf("%s: no command", where)
			continue
		}
		count[svc.Command[0]]++
		flags := checkFlags(t, where, svc.Command)
		if len(svc.Healthcheck.Test) < 3 || svc.Healthcheck.Test[0] != "CMD" || svc.Healthcheck.Test[1] != "/apiary" {
			t.Errorf("%s: health check %v; want [CMD /apiary health ...] (no shell in the image)", where, svc.Healthcheck.Test)
		} else {
			hf := checkFlags(t, where+" health check", svc.Healthcheck.Test[2:])
			for _, k := range []string{"tls-ca", "tls-cert", "tls-key"} {
				flags[k] = append(flags[k], hf[k]...)
			}
		}
		mounted := map[string]string{}
		for _, v := range svc.Volumes {
			parts := strings.Split(v, ":")
			if len(parts) >= 2 {
				mounted[parts[1]] = parts[0]
			}
		}
		for _, k := range []string{"tls-ca", "tls-cert", "tls-key", "policy"} {
			for _, p := range flags[k] {
				src, ok := mounted[p]
				if !ok {
					t.Errorf("%s: --%s=%s is not mounted", where, k, p)
					continue
				}
				if k == "policy" {
					if src != "../policy.yaml" {
						t.Errorf("%s: the policy comes from %s; want deploy/policy.yaml", where, src)
					}
					continue
				}
				stem := strings.TrimSuffix(strings.TrimSuffix(filepath.Base(src), ".pem"), "-key")
				if stem != "apiary-ca" && !strings.Contains(string(certs), " "+strings.NewReplacer("c1", "c$i", "c2", "c$i", "c3", "c$i", "n1", "n$i", "n2", "n$i", "router-1", "router-$i", "router-2", "router-$i").Replace(stem)+" ") {
					t.Errorf("%s: %s is made by no line of certs.sh", where, src)
				}
			}
		}
		// The health checks are readiness (the gRPC serving check, which a
		// coordinator without its quorum fails): nothing may restart a
		// container on them. Docker does not; swarm (deploy:) and
		// autoheal would.
		if svc.Deploy != nil || strings.Contains(strings.ToLower(fmt.Sprint(svc.Labels)), "autoheal") {
			t.Errorf("%s: deploy: %v, labels %v: would restart containers whose health check fails, i.e. healthy coordinators of a region "+
				"that lost its quorum; the health checks here are readiness only", where, svc.Deploy, svc.Labels)
		}
		for _, p := range svc.Ports {
			if !strings.HasPrefix(p, "127.0.0.1:") {
				t.Errorf("%s: port %s is published beyond 127.0.0.1", where, p)
			}
		}
	}
	if count["region"] != 6 || count["agent"] != 4 || count["global"] != 2 {
		t.Errorf("services by role %v; want 6 coordinators, 4 agents, 2 routers", count)
	}
	dc, err := exec.LookPath("docker-compose")
	if err != nil {
		t.Log("docker-compose not installed: its own check of the file is skipped")
		return
	}
	// config reads env_file: give it one.
	dir := t.TempDir()
	cp := func(src, dst string) {
		b, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(dst, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cp("compose/docker-compose.yml", filepath.Join(dir, "docker-compose.yml"))
	os.MkdirAll(filepath.Join(dir, "tls", "10.97"), 0o700)
	os.WriteFile(filepath.Join(dir, "tls", "10.97", "gossip.env"), []byte("APIARY_GOSSIP_KEY=x\n"), 0o600)
	if out, err := exec.Command(dc, "-f", filepath.Join(dir, "docker-compose.yml"), "config", "-q").CombinedOutput(); err != nil {
		t.Errorf("docker-compose config: %v\n%s", err, out)
	}
}

// composeFile is the part of docker-compose.yml the certificate test reads.
type composeFile struct {
	Services map[string]struct {
		Command  []string `json:"command"`
		Volumes  []string `json:"volumes"`
		EnvFile  any      `json:"env_file"`
		Networks map[string]struct {
			IPv4 string `json:"ipv4_address"`
		} `json:"networks"`
	} `json:"services"`
}

// readCompose reads the compose file at path with ${APIARY_NET_PREFIX...}
// set to prefix, as docker-compose interpolates it (the other variables are
// left as written).
func readCompose(t *testing.T, path, prefix string) composeFile {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	b = regexp.MustCompile(`\$\{APIARY_NET_PREFIX(:-[0-9.]+)?\}`).ReplaceAll(b, []byte(prefix))
	var f composeFile
	// Agents list their networks (no fixed address): decode those apart.
	b = regexp.MustCompile(`(?m)^    networks:\n      - (\S+)$`).ReplaceAll(b, []byte("    networks:\n      $1: {}"))
	if err := yaml.Unmarshal(b, &f); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return f
}

// TestComposeCertsKeyedByPrefix runs certs.sh (with the built binary) for
// two APIARY_NET_PREFIX values, as two copies of the federation would, and
// checks what each copy would mount: every TLS file and the gossip key the
// compose file names under that prefix exist, and each coordinator's
// certificate carries exactly the IPs the compose file gives that
// coordinator under that prefix (a copy that mounted another prefix's
// certificates fails its peers' TLS checks). A rerun keeps every file; a
// certificate whose recorded arguments differ from the script's is made
// again; a malformed prefix is refused.
func TestComposeCertsKeyedByPrefix(t *testing.T) {
	dir := t.TempDir()
	for _, f := range []string{"certs.sh", "docker-compose.yml"} {
		b, err := os.ReadFile(filepath.Join("compose", f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, f), b, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	certs := func(prefix string) (string, error) {
		out, err := exec.Command(filepath.Join(dir, "certs.sh"), testutil.Binary(t), prefix).CombinedOutput()
		return string(out), err
	}
	snapshot := func() map[string]string {
		m := map[string]string{}
		filepath.WalkDir(filepath.Join(dir, "tls"), func(p string, d os.DirEntry, err error) error {
			if err == nil && !d.IsDir() {
				b, _ := os.ReadFile(p)
				m[p] = string(b)
			}
			return nil
		})
		return m
	}
	prefixes := []string{"10.97", "10.96"}
	for _, p := range prefixes {
		if out, err := certs(p); err != nil {
			t.Fatalf("certs.sh %s: %v\n%s", p, err, out)
		}
	}
	for _, p := range prefixes {
		f := readCompose(t, filepath.Join(dir, "docker-compose.yml"), p)
		coordinators := 0
		for name, svc := range f.Services {
			where := fmt.Sprintf("prefix %s, service %s", p, name)
			var files []string
			if s, ok := svc.EnvFile.(string); ok {
				files = append(files, s)
			}
			certOf := map[string]string{}
			for _, v := range svc.Volumes {
				src, dst, _ := strings.Cut(v, ":")
				dst, _, _ = strings.Cut(dst, ":")
				if strings.HasPrefix(src, "./tls/") {
					files = append(files, src)
					certOf[dst] = src
				}
			}
			for _, fl := range files {
				if _, err := os.Stat(filepath.Join(dir, fl)); err != nil {
					t.Errorf("%s: mounts %s, which certs.sh %s did not make", where, fl, p)
				}
			}
			flags, _ := parseArgs(svc.Command[1:])
			if svc.Command[0] != "region" {
				continue
			}
			coordinators++
			var wantIPs []string
			for _, n := range svc.Networks {
				wantIPs = append(wantIPs, n.IPv4)
			}
			src := certOf[strings.Join(flags["tls-cert"], "")]
			b, err := os.ReadFile(filepath.Join(dir, src))
			if err != nil {
				t.Errorf("%s: --tls-cert %v: %v", where, flags["tls-cert"], err)
				continue
			}
			blk, _ := pem.Decode(b)
			if blk == nil {
				t.Errorf("%s: %s holds no PEM block", where, src)
				continue
			}
			c, err := x509.ParseCertificate(blk.Bytes)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, ip := range c.IPAddresses {
				if !ip.IsLoopback() { // apiary tls adds 127.0.0.1 and ::1
					got = append(got, ip.String())
				}
			}
			slices.Sort(got)
			slices.Sort(wantIPs)
			if !slices.Equal(got, wantIPs) {
				t.Errorf("%s: certificate %s carries IPs %v (and loopback); the compose file gives this coordinator %v", where, src, got, wantIPs)
			}
		}
		if coordinators != 6 {
			t.Errorf("prefix %s: %d coordinators checked; want 6", p, coordinators)
		}
	}

	before := snapshot()
	if out, err := certs("10.97"); err != nil {
		t.Fatalf("certs.sh again: %v\n%s", err, out)
	}
	if after := snapshot(); !maps.Equal(before, after) {
		t.Errorf("certs.sh run again changed files; want every file kept")
	}
	// The script's arguments for a certificate changed (as by an edit of
	// certs.sh): that certificate is made again, the others are kept.
	rec := filepath.Join(dir, "tls", "10.97", ".args", "eu-west-region-c1")
	if err := os.WriteFile(rec, []byte("--role region --region eu-west --id c1 --ip 10.1.1.1\n"), 0o600); err != nil { // rewritten by the rerun
		t.Fatal(err)
	}
	if out, err := certs("10.97"); err != nil {
		t.Fatalf("certs.sh after the change: %v\n%s", err, out)
	}
	after := snapshot()
	for path, content := range before {
		changed := after[path] != content
		if want := strings.Contains(path, "10.97/eu-west-region-c1"); changed != want {
			t.Errorf("%s: changed %v; want %v", path, changed, want)
		}
	}
	for _, bad := range []string{"10.97.1", "10", "10.256", "a.b", "10..1", ".10"} {
		out, err := certs(bad)
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 || !strings.Contains(out, "NET_PREFIX") {
			t.Errorf("certs.sh %q: %v\n%s; want exit 2 naming NET_PREFIX", bad, err, out)
		}
	}
}
