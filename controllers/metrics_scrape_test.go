package controllers

import (
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// Every pod the operator runs serves Prometheus metrics on a port named
// "metrics" and carries the labels the chart's PodMonitor selects
// (charts/catena/templates/monitors.yaml): app.kubernetes.io/name=catena
// and a component among replica, ingest and aggregator.
func TestOperandPodsAreScraped(t *testing.T) {
	pool, stream, agg := testPool(nil), testStream(nil), testAggregation()
	for name, tmpl := range map[string]corev1.PodTemplateSpec{
		"replica":    desiredStatefulSet(pool, "img").Spec.Template,
		"ingest":     desiredIngestDeployment(stream, pool, "img").Spec.Template,
		"aggregator": desiredWorkers(agg, "img").Spec.Template,
	} {
		if tmpl.Labels[labelName] != appName || !slices.Contains([]string{"replica", "ingest", "aggregator"}, tmpl.Labels[labelComponent]) {
			t.Errorf("%s pods are labelled %v", name, tmpl.Labels)
		}
		var port *corev1.ContainerPort
		for _, c := range tmpl.Spec.Containers {
			for i := range c.Ports {
				if c.Ports[i].Name == "metrics" {
					port = &c.Ports[i]
				}
			}
		}
		if port == nil || port.ContainerPort != metricsPort {
			t.Errorf("%s pods have no port \"metrics\" on %d: %+v", name, metricsPort, tmpl.Spec.Containers)
		}
	}
}
