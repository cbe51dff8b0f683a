package controllers

import (
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"

	streamsv1alpha1 "github.com/catena-streams/catena/api/v1alpha1"
)

func kafkaStream(mutate func(*streamsv1alpha1.StreamSpec)) *streamsv1alpha1.Stream {
	return testStream(func(s *streamsv1alpha1.StreamSpec) {
		s.Ingestion.Kafka = &streamsv1alpha1.KafkaListener{Enabled: true}
		s.VolumeReclaimPolicy = streamsv1alpha1.VolumeReclaimDelete
		if mutate != nil {
			mutate(s)
		}
	})
}

func TestKafkaListenerObjects(t *testing.T) {
	pool := testPool(nil)
	pool.Name = "events-pool"

	t.Run("off: nothing of Kafka", func(t *testing.T) {
		for _, s := range []*streamsv1alpha1.Stream{testStream(nil), testStream(func(s *streamsv1alpha1.StreamSpec) {
			s.Ingestion.Kafka = &streamsv1alpha1.KafkaListener{}
		})} {
			got := desiredIngestion(s, pool, "img")
			if got.Brokers != nil || got.Groups != nil || len(got.Service.Spec.Ports) != 1 {
				t.Fatalf("brokers %v, groups %v, service ports %v", got.Brokers, got.Groups, got.Service.Spec.Ports)
			}
			c := got.Deployment.Spec.Template.Spec.Containers[0]
			if len(c.Env) != 0 || slices.ContainsFunc(c.Args, func(a string) bool { return strings.HasPrefix(a, "--kafka") || strings.HasPrefix(a, "--peers") }) {
				t.Fatalf("container env %v args %v", c.Env, c.Args)
			}
			if ingestKafkaTLSArgs(s) != nil {
				t.Fatal("TLS args for Kafka without Kafka")
			}
		}
	})

	stream := kafkaStream(nil)
	got := desiredIngestion(stream, pool, "img")
	c := got.Deployment.Spec.Template.Spec.Containers[0]
	for _, want := range []string{
		"--kafka-listen=:9092",
		"--kafka-advertise=[$(POD_IP)]:9092",
		"--peers=events-kafka.ns.svc",
		"--groups-stream=events-groups",
	} {
		if !slices.Contains(c.Args, want) {
			t.Errorf("args %v lack %s", c.Args, want)
		}
	}
	if len(c.Env) != 1 || c.Env[0].Name != "POD_IP" || c.Env[0].ValueFrom.FieldRef.FieldPath != "status.podIP" {
		t.Errorf("env %+v, want POD_IP from status.podIP", c.Env)
	}
	if !slices.ContainsFunc(c.Ports, func(p corev1.ContainerPort) bool { return p.Name == "kafka" && p.ContainerPort == 9092 }) {
		t.Errorf("container ports %v lack kafka", c.Ports)
	}
	if diff := cmp.Diff([]string{"grpc", "kafka"}, portNames(got.Service.Spec.Ports)); diff != "" {
		t.Errorf("ingestion Service ports (-want +got):\n%s", diff)
	}

	b := got.Brokers
	if b.Name != "events-kafka" || b.Spec.ClusterIP != corev1.ClusterIPNone || b.Spec.PublishNotReadyAddresses ||
		!cmp.Equal(b.Spec.Selector, ingestSelectorLabels(stream)) || !cmp.Equal(portNames(b.Spec.Ports), []string{"kafka"}) {
		t.Errorf("brokers Service %+v: want headless, ready pods only, the ingestion pods' selector, the kafka port", b)
	}

	g := got.Groups
	if g.Name != "events-groups" || g.Namespace != "ns" || g.Spec.Pool != "events-pool" || g.Spec.Partitions != 1 ||
		g.Spec.ReplicationFactor != 3 || g.Spec.Retention != nil || g.Spec.Access == nil || len(g.Spec.Access.Users) != 0 ||
		g.Spec.Ingestion.Kafka != nil || g.Spec.VolumeReclaimPolicy != streamsv1alpha1.VolumeReclaimDelete ||
		g.Spec.Durability.Mode != streamsv1alpha1.DurabilityFsync {
		t.Errorf("groups Stream %+v: want one partition on the Stream's pool, as many copies, no retention, no users, no Kafka of its own, the Stream's reclaim policy", g.Spec)
	}
	shared := desiredIngestion(kafkaStream(func(s *streamsv1alpha1.StreamSpec) { s.Pool = "shared" }), pool, "img")
	if shared.Groups.Spec.Pool != "shared" {
		t.Errorf("groups Stream of a Stream on pool shared is on %q", shared.Groups.Spec.Pool)
	}

	if diff := cmp.Diff([]string{"--kafka-broker-domain=events-kafka.ns.svc", "--peer-server-name=events.ns.svc"}, ingestKafkaTLSArgs(stream)); diff != "" {
		t.Errorf("TLS args (-want +got):\n%s", diff)
	}
	leaf := ingestLeaf(stream)
	for _, want := range []string{"*.events-kafka.ns.svc", "*.events-kafka.ns.svc.cluster.local", "events.ns.svc"} {
		if !slices.Contains(leaf.DNSNames, want) {
			t.Errorf("certificate names %v lack %s", leaf.DNSNames, want)
		}
	}
}

func TestKafkaPeersAdmitEachOther(t *testing.T) {
	s := accessStream(&streamsv1alpha1.StreamAccess{})
	s.Spec.Ingestion.Kafka = &streamsv1alpha1.KafkaListener{Enabled: true}
	self := ingestIdentity(s)
	for _, a := range ingestAccessArgs(s, testOperator) {
		if (strings.HasPrefix(a, "--allow-consume=") || strings.HasPrefix(a, "--allow-metadata=") || strings.HasPrefix(a, "--allow-other-streams=")) && !strings.Contains(a, self) {
			t.Errorf("%s does not admit the ingestion pods' own identity %s: a forwarded group request would be refused", a, self)
		}
		if strings.HasPrefix(a, "--allow-produce=") && strings.Contains(a, self) {
			t.Errorf("%s admits the ingestion pods, which forward no produce", a)
		}
	}
}

func TestKafkaEndpointInStatus(t *testing.T) {
	s := kafkaStream(nil)
	if got := streamStatus(s, streamObservation{IngestServiceFound: true, KafkaReady: true}).Endpoints.Kafka; got != "events.ns.svc:9092" {
		t.Errorf("kafka endpoint %q", got)
	}
	if got := streamStatus(s, streamObservation{IngestServiceFound: true}).Endpoints.Kafka; got != "" {
		t.Errorf("kafka endpoint %q before its objects exist", got)
	}
	if got := streamStatus(testStream(nil), streamObservation{IngestServiceFound: true, KafkaReady: true}).Endpoints.Kafka; got != "" {
		t.Errorf("kafka endpoint %q without Kafka", got)
	}
}

func portNames(ports []corev1.ServicePort) []string {
	var out []string
	for _, p := range ports {
		out = append(out, p.Name)
	}
	return out
}
