package envtest_test

import (
	"fmt"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/yaml"
)

// manifest builds an object of the streams.catena.io/v1alpha1 kind from
// the YAML of its spec, as a user would write it: what the API server gets
// is exactly that YAML, with no Go defaults or omitted zero values in
// between.
func manifest(namespace, kind, name, spec string) *unstructured.Unstructured {
	var b strings.Builder
	fmt.Fprintf(&b, "apiVersion: streams.catena.io/v1alpha1\nkind: %s\nmetadata:\n  name: %s\n  namespace: %s\nspec:\n", kind, name, namespace)
	for line := range strings.SplitSeq(strings.TrimSpace(spec), "\n") {
		b.WriteString("  " + line + "\n")
	}
	return fromYAML(b.String())
}

// fromYAML decodes one YAML document into an object.
func fromYAML(doc string) *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	ExpectWithOffset(2, yaml.Unmarshal([]byte(doc), &u.Object)).To(Succeed(), "bad test manifest:\n%s", doc)
	return u
}

// expectRejected asserts that err is the API server refusing an invalid
// object, with message among its reasons.
func expectRejected(err error, message string) {
	ExpectWithOffset(1, err).To(HaveOccurred(), "the API server accepted the object; it should have said %q", message)
	ExpectWithOffset(1, apierrors.IsInvalid(err)).To(BeTrue(), "want an Invalid error, got: %v", err)
	ExpectWithOffset(1, err.Error()).To(ContainSubstring(message))
	GinkgoWriter.Printf("rejected: %v\n", err)
}

// expectAbsent asserts that a rejected create stored nothing.
func expectAbsent(u *unstructured.Unstructured) {
	got := &unstructured.Unstructured{}
	got.SetGroupVersionKind(u.GroupVersionKind())
	err := k8s.Get(ctx, types.NamespacedName{Namespace: u.GetNamespace(), Name: u.GetName()}, got)
	ExpectWithOffset(1, apierrors.IsNotFound(err)).To(BeTrue(), "a rejected object was stored: %v", err)
}

// get reads the stored version of u.
func get(u *unstructured.Unstructured) *unstructured.Unstructured {
	got := &unstructured.Unstructured{}
	got.SetGroupVersionKind(u.GroupVersionKind())
	ExpectWithOffset(1, k8s.Get(ctx, types.NamespacedName{Namespace: u.GetNamespace(), Name: u.GetName()}, got)).To(Succeed())
	return got
}

// set changes the field at path of u to value (YAML, so that "10Gi" and 3
// keep the types a user's manifest would give them).
func set(u *unstructured.Unstructured, path, value string) {
	var v any
	ExpectWithOffset(1, yaml.Unmarshal([]byte(value), &v)).To(Succeed())
	ExpectWithOffset(1, unstructured.SetNestedField(u.Object, v, strings.Split(path, ".")...)).To(Succeed())
}

// field reads the field at path of u.
func field(u *unstructured.Unstructured, path string) any {
	v, _, err := unstructured.NestedFieldNoCopy(u.Object, strings.Split(path, ".")...)
	ExpectWithOffset(1, err).NotTo(HaveOccurred())
	return v
}

// expectField asserts that the field at path of u is want; nil means absent.
func expectField(u *unstructured.Unstructured, path string, want any) {
	if want == nil {
		ExpectWithOffset(1, field(u, path)).To(BeNil(), "%s", path)
		return
	}
	ExpectWithOffset(1, field(u, path)).To(Equal(want), "%s", path)
}
