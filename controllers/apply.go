package controllers

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
)

// fieldOwner is the one field manager of everything the operator applies.
const fieldOwner = "catena-operator"

// applyOwned sets owner as obj's controller and applies obj with
// server-side apply under fieldOwner, taking over fields another manager
// set. obj is a typed object built from scratch by a desired* function, so
// every field it carries is one the operator means to own; its status, if
// any, is dropped.
func applyOwned(ctx context.Context, c client.Client, scheme *runtime.Scheme, owner, obj client.Object) error {
	if err := controllerutil.SetControllerReference(owner, obj, scheme); err != nil {
		return fmt.Errorf("failed to set the owner of %s %s: %w", kindOf(obj), obj.GetName(), err)
	}
	return apply(ctx, c, obj)
}

// apply applies obj with server-side apply under fieldOwner. obj must carry
// its apiVersion and kind.
func apply(ctx context.Context, c client.Client, obj client.Object) error {
	content, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		return fmt.Errorf("failed to convert %s %s for apply: %w", kindOf(obj), obj.GetName(), err)
	}
	u := &unstructured.Unstructured{Object: content}
	// Status is not applied through the main resource, and a zero
	// creationTimestamp is not a value to own.
	unstructured.RemoveNestedField(u.Object, "status")
	unstructured.RemoveNestedField(u.Object, "metadata", "creationTimestamp")
	if err := c.Apply(ctx, client.ApplyConfigurationFromUnstructured(u), client.FieldOwner(fieldOwner), client.ForceOwnership); err != nil {
		return fmt.Errorf("failed to apply %s %s: %w", kindOf(obj), obj.GetName(), err)
	}
	return nil
}

func kindOf(obj client.Object) string {
	if k := obj.GetObjectKind().GroupVersionKind().Kind; k != "" {
		return k
	}
	return fmt.Sprintf("%T", obj)
}

// specHashAnnotation is the hash of what the operator last applied to an
// object: it is applied again only when that changes (or, for a Stream's
// objects, at the periodic re-apply), not on every reconcile.
const specHashAnnotation = "streams.catena.io/applied-hash"

// stampHash sets desired's specHashAnnotation to the hash of desired
// without it, and returns the hash.
func stampHash(desired client.Object) (string, error) {
	ann := maps.Clone(desired.GetAnnotations())
	delete(ann, specHashAnnotation)
	desired.SetAnnotations(ann)
	b, err := json.Marshal(desired)
	if err != nil {
		return "", fmt.Errorf("failed to encode %s %s: %w", kindOf(desired), desired.GetName(), err)
	}
	sum := sha256.Sum256(b)
	hash := hex.EncodeToString(sum[:8])
	if ann == nil {
		ann = map[string]string{}
	}
	ann[specHashAnnotation] = hash
	desired.SetAnnotations(ann)
	return hash, nil
}

// appliedAlready reports whether current carries hash: it is what the
// operator would apply.
func appliedAlready(current client.Object, hash string) bool {
	return current.GetAnnotations()[specHashAnnotation] == hash
}
