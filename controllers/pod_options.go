package controllers

import (
	"maps"
	"slices"

	corev1 "k8s.io/api/core/v1"

	streamsv1alpha1 "github.com/catena-streams/catena/api/v1alpha1"
)

// applyPodOptions adds an object's pod options to a pod template the
// operator built: the operator's labels and annotations win over the
// user's (its labels select the pods), image pull Secrets are added after
// those already there.
func applyPodOptions(tmpl *corev1.PodTemplateSpec, opts *streamsv1alpha1.PodOptions) {
	if opts == nil {
		return
	}
	tmpl.Labels = mergeUnder(tmpl.Labels, opts.Labels)
	tmpl.Annotations = mergeUnder(tmpl.Annotations, opts.Annotations)
	for _, s := range opts.ImagePullSecrets {
		addImagePullSecret(&tmpl.Spec, s.Name)
	}
	if opts.PriorityClassName != "" {
		tmpl.Spec.PriorityClassName = opts.PriorityClassName
	}
}

// addImagePullSecrets adds the operator's image pull Secrets (the chart's
// imagePullSecrets, --image-pull-secrets) to a pod spec, first.
func addImagePullSecrets(spec *corev1.PodSpec, names []string) {
	var own []corev1.LocalObjectReference
	for _, n := range names {
		if n != "" && !slices.ContainsFunc(own, func(r corev1.LocalObjectReference) bool { return r.Name == n }) {
			own = append(own, corev1.LocalObjectReference{Name: n})
		}
	}
	for _, r := range spec.ImagePullSecrets {
		if !slices.ContainsFunc(own, func(o corev1.LocalObjectReference) bool { return o.Name == r.Name }) {
			own = append(own, r)
		}
	}
	spec.ImagePullSecrets = own
}

func addImagePullSecret(spec *corev1.PodSpec, name string) {
	if name == "" || slices.ContainsFunc(spec.ImagePullSecrets, func(r corev1.LocalObjectReference) bool { return r.Name == name }) {
		return
	}
	spec.ImagePullSecrets = append(spec.ImagePullSecrets, corev1.LocalObjectReference{Name: name})
}

// mergeUnder returns base with extra's keys that base does not have.
func mergeUnder(base, extra map[string]string) map[string]string {
	if len(extra) == 0 {
		return base
	}
	out := maps.Clone(extra)
	maps.Copy(out, base)
	return out
}
