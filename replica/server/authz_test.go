package server

import (
	"testing"

	"github.com/catena-streams/catena/rpc/catenapb"
)

// A method without a class is refused to every caller once a policy is on:
// a new RPC must be given one here.
func TestEveryReplicaMethodHasAClass(t *testing.T) {
	classes := MethodClasses()
	desc := catenapb.Replica_ServiceDesc
	var names []string
	for _, m := range desc.Methods {
		names = append(names, m.MethodName)
	}
	for _, s := range desc.Streams {
		names = append(names, s.StreamName)
	}
	for _, n := range names {
		if _, ok := classes["/"+desc.ServiceName+"/"+n]; !ok {
			t.Errorf("Replica.%s has no class in MethodClasses", n)
		}
	}
	if len(classes) != len(names) {
		t.Errorf("MethodClasses has %d methods, the service %d", len(classes), len(names))
	}
}
