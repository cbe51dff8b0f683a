package controllers

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"

	streamsv1alpha1 "github.com/catena-streams/catena/api/v1alpha1"
)

// Every pod the operator runs takes its object's spec.pod, under the
// operator's own labels, and the operator's pull Secrets first.
func TestPodOptionsReachEveryOperandPod(t *testing.T) {
	opts := &streamsv1alpha1.PodOptions{
		ImagePullSecrets:  []corev1.LocalObjectReference{{Name: "team-registry"}, {Name: "regcred"}},
		Annotations:       map[string]string{"sidecar.istio.io/inject": "false"},
		Labels:            map[string]string{"team": "payments", "app.kubernetes.io/component": "mine"},
		PriorityClassName: "catena-critical",
	}
	pool := testPool(func(s *streamsv1alpha1.ReplicaPoolSpec) { s.Pod = opts })
	stream := testStream(func(s *streamsv1alpha1.StreamSpec) { s.Pod = opts })
	agg := testAggregation()
	agg.Spec.Pod = opts

	ownPool := &streamsv1alpha1.ReplicaPool{Spec: stream.OwnPoolSpec()}
	ownPool.Name, ownPool.Namespace = stream.OwnPoolName(), stream.Namespace
	templates := map[string]*corev1.PodTemplateSpec{
		"replica":    &desiredStatefulSet(pool, "catena:test").Spec.Template,
		"own pool":   &desiredStatefulSet(ownPool, "catena:test").Spec.Template,
		"ingestion":  &desiredIngestDeployment(stream, pool, "catena:test").Spec.Template,
		"aggregator": &desiredWorkers(agg, "catena:test").Spec.Template,
	}
	wantComponent := map[string]string{"replica": componentReplica, "own pool": componentReplica}
	for name, tmpl := range templates {
		addImagePullSecrets(&tmpl.Spec, []string{"regcred", "operator-wide"})
		var secrets []string
		for _, s := range tmpl.Spec.ImagePullSecrets {
			secrets = append(secrets, s.Name)
		}
		if diff := cmp.Diff([]string{"regcred", "operator-wide", "team-registry"}, secrets); diff != "" {
			t.Errorf("%s: image pull Secrets (-want +got):\n%s", name, diff)
		}
		if tmpl.Labels["team"] != "payments" || tmpl.Annotations["sidecar.istio.io/inject"] != "false" || tmpl.Spec.PriorityClassName != "catena-critical" {
			t.Errorf("%s: labels %v annotations %v priority class %q", name, tmpl.Labels, tmpl.Annotations, tmpl.Spec.PriorityClassName)
		}
		if c := tmpl.Labels["app.kubernetes.io/component"]; c == "mine" || (wantComponent[name] != "" && c != wantComponent[name]) {
			t.Errorf("%s: the user's label replaced the operator's selector label: component=%q", name, c)
		}
	}

	// Without options, nothing is added.
	plain := desiredStatefulSet(testPool(nil), "catena:test").Spec.Template
	if len(plain.Spec.ImagePullSecrets) != 0 || plain.Annotations != nil || plain.Spec.PriorityClassName != "" {
		t.Errorf("a pool without spec.pod: %+v", plain)
	}
}
