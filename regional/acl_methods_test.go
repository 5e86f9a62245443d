package regional

import (
	"testing"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/reflect/protoreflect"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
)

// TestACLEveryMethodHasANeed walks the API's services: every method has an
// entry in aclMethods, chosen on purpose (a new RPC fails this test until
// it gets one), and the table names no method the API does not have.
func TestACLEveryMethodHasANeed(t *testing.T) {
	seen := map[string]bool{}
	for _, fd := range []protoreflect.FileDescriptor{apiaryv1.File_apiary_v1_apiary_proto, healthpb.File_grpc_health_v1_health_proto} {
		svcs := fd.Services()
		for i := 0; i < svcs.Len(); i++ {
			ms := svcs.Get(i).Methods()
			for j := 0; j < ms.Len(); j++ {
				full := "/" + string(svcs.Get(i).FullName()) + "/" + string(ms.Get(j).Name())
				seen[full] = true
				if _, ok := aclMethods[full]; !ok {
					t.Errorf("%s has no ACL rule in aclMethods (regional/acl.go)", full)
				}
			}
		}
	}
	for m := range aclMethods {
		if !seen[m] {
			t.Errorf("aclMethods names %s, which the API does not have", m)
		}
	}
	if got := shortMethod(apiaryv1.JobService_GetJob_FullMethodName); got != "JobService/GetJob" {
		t.Errorf("shortMethod = %q", got)
	}
}
