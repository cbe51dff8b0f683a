package v1alpha1

import corev1 "k8s.io/api/core/v1"

// PodOptions are settings of the pods the operator runs for an object, for
// what a cluster requires of every pod: pulling from a private registry,
// annotations and labels that admission, mesh or cost tooling reads, a
// priority class.
type PodOptions struct {
	// imagePullSecrets name Secrets, in the object's namespace, to pull the
	// operand image with; in addition to those the operator is started
	// with (the chart's imagePullSecrets).
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=16
	ImagePullSecrets []corev1.LocalObjectReference `json:"imagePullSecrets,omitempty"`

	// annotations are added to each pod. The operator's own annotations
	// win over these.
	// +optional
	// +kubebuilder:validation:MaxProperties=64
	Annotations map[string]string `json:"annotations,omitempty"`

	// labels are added to each pod. The operator's own labels (app.kubernetes.io/*),
	// which select the pods, win over these.
	// +optional
	// +kubebuilder:validation:MaxProperties=64
	Labels map[string]string `json:"labels,omitempty"`

	// priorityClassName is the PriorityClass of each pod.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	PriorityClassName string `json:"priorityClassName,omitempty"`
}
