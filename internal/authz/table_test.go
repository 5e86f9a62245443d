package authz

import (
	"testing"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/pki"
)

// servedFiles are the generated descriptors of every service our servers
// register: a new service or RPC in them needs a rule in methods.
var servedFiles = []protoreflect.FileDescriptor{
	apiaryv1.File_apiary_v1_apiary_proto,
	healthpb.File_grpc_health_v1_health_proto,
}

func fullMethod(md protoreflect.MethodDescriptor) string {
	return "/" + string(md.Parent().FullName()) + "/" + string(md.Name())
}

// TestEveryMethodHasARule walks every method of every service in the
// generated file descriptors: each must have an explicit rule (so adding
// an RPC to the proto fails here until someone decides who may call it),
// the table must name no method that does not exist, and every
// AgentService request must carry the node_id the rule binds to the agent
// certificate.
func TestEveryMethodHasARule(t *testing.T) {
	seen := map[string]bool{}
	for _, fd := range servedFiles {
		svcs := fd.Services()
		for i := 0; i < svcs.Len(); i++ {
			sd := svcs.Get(i)
			for j := 0; j < sd.Methods().Len(); j++ {
				md := sd.Methods().Get(j)
				name := fullMethod(md)
				seen[name] = true
				r, ok := methods[name]
				if !ok {
					t.Errorf("%s has no rule in internal/authz/table.go: decide who may call it and add it", name)
					continue
				}
				if r.service != string(sd.FullName()) {
					t.Errorf("%s: rule names service %q", name, r.service)
				}
				// Behaviour, not just the map: no identity gets "denied by default".
				for _, p := range []Policy{{Role: pki.RoleRegion, Region: "eu-west"}, {Role: pki.RoleRouter, Region: pki.GlobalRegion}} {
					for _, role := range pki.Roles {
						id := pki.Identity{Role: role, Region: "eu-west", ID: "n1"}
						if role == pki.RoleRouter || role == pki.RoleClient {
							id.Region = pki.GlobalRegion
						}
						if _, d := p.decide(p.Validate(), id, nil, name); d != nil && d.reason == ReasonUnknownMethod {
							t.Errorf("%s on a %s server, %s caller: %s", name, p.Role, role, d.msg)
						}
					}
				}
				if sd.FullName() != agentService {
					continue
				}
				if r.access != accessAgent {
					t.Errorf("%s: AgentService methods must be node-bound (accessAgent)", name)
				}
				f := md.Input().Fields().ByName("node_id")
				if f == nil || f.Kind() != protoreflect.StringKind {
					t.Errorf("%s: request %s has no string node_id: the agent certificate's id cannot be checked", name, md.Input().FullName())
				}
				mt, err := protoregistry.GlobalTypes.FindMessageByName(md.Input().FullName())
				if err != nil {
					t.Fatal(err)
				}
				if _, ok := mt.New().Interface().(nodeIDer); !ok {
					t.Errorf("%s: %T has no GetNodeId", name, mt.New().Interface())
				}
			}
		}
	}
	for name := range methods {
		if !seen[name] {
			t.Errorf("the table has a rule for %s, which no served service has", name)
		}
	}
	if len(seen) < 27 {
		t.Fatalf("walked only %d methods: are the descriptors right?", len(seen))
	}
}
