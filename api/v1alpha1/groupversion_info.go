// Package v1alpha1 is the streams.catena.io/v1alpha1 API: ReplicaPool,
// Stream, Partition and ReplicationChain.
//
// Users write ReplicaPools and Streams. The operator writes Partitions and
// ReplicationChains, one of each per partition of a Stream, owned by it.
// The API server rejects invalid specs through the schema and its CEL rules
// (see each type's markers); the controllers never have to.
//
// +kubebuilder:object:generate=true
// +groupName=streams.catena.io
package v1alpha1

import (
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/scheme"
)

var (
	// GroupVersion is the group and version of every kind in this package.
	GroupVersion = schema.GroupVersion{Group: "streams.catena.io", Version: "v1alpha1"}

	// SchemeBuilder registers the kinds of this package with a scheme.
	SchemeBuilder = &scheme.Builder{GroupVersion: GroupVersion}

	// AddToScheme adds the kinds of this package to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)
