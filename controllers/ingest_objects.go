package controllers

import (
	"cmp"
	"fmt"
	"net"
	"strconv"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	streamsv1alpha1 "github.com/catena-streams/catena/api/v1alpha1"
)

// Ports and names of an ingestion pod. `catena ingest` serves producers and
// consumers over gRPC on ingestPort, and its Service exposes the same port;
// Prometheus metrics on metricsPort, as replicas do.
const (
	ingestPort      int32 = 7070
	ingestPortName        = "grpc"
	ingestContainer       = "ingest"
	componentIngest       = "ingest"
)

// ingestSelectorLabels select the ingestion pods of a Stream. They are the
// Deployment's immutable selector: never change them.
func ingestSelectorLabels(stream *streamsv1alpha1.Stream) map[string]string {
	return selectorLabels(componentIngest, stream.Name)
}

// ingestLabels are the selector labels, the Stream's and who manages the
// object.
func ingestLabels(stream *streamsv1alpha1.Stream) map[string]string {
	l := ingestSelectorLabels(stream)
	l[labelManagedBy] = fieldOwner
	l[labelStream] = stream.Name
	return l
}

// ingestEndpoint is the in-cluster address of a Stream's ingestion Service,
// which producers and consumers connect to.
func ingestEndpoint(stream *streamsv1alpha1.Stream) string {
	return fmt.Sprintf("%s.%s.svc:%d", stream.IngestServiceName(), stream.Namespace, ingestPort)
}

// ingestion is a Stream's ingestion tier: a Deployment of `catena ingest`
// pods, the ClusterIP Service clients connect to, and a
// PodDisruptionBudget.
type ingestion struct {
	// Deployment is nil while the pool hosting the Stream is unknown: its
	// pods need the address of every replica.
	Deployment *appsv1.Deployment
	Service    *corev1.Service
	PDB        *policyv1.PodDisruptionBudget
	// External is the Service clients outside the cluster use (nil: the
	// Stream has no external listener).
	External *corev1.Service
}

// desiredIngestion builds a Stream's ingestion tier from its spec and the
// pool hosting it (nil when that pool does not exist or is not the
// Stream's to use). It reads nothing but its arguments; owner references
// are set by the caller.
func desiredIngestion(stream *streamsv1alpha1.Stream, pool *streamsv1alpha1.ReplicaPool, image string) ingestion {
	out := ingestion{Service: desiredIngestService(stream), PDB: desiredIngestPDB(stream), External: desiredExternalService(stream)}
	if pool != nil {
		out.Deployment = desiredIngestDeployment(stream, pool, image)
	}
	return out
}

func desiredIngestDeployment(stream *streamsv1alpha1.Stream, pool *streamsv1alpha1.ReplicaPool, image string) *appsv1.Deployment {
	spec := stream.Spec.Ingestion
	replicas := spec.Replicas
	if replicas == 0 {
		// The schema defaults it; a Stream built in Go may not have been
		// through the API server.
		replicas = streamsv1alpha1.DefaultIngestionReplicas
	}
	var resources corev1.ResourceRequirements
	if spec.Resources != nil {
		resources = *spec.Resources.DeepCopy()
	}

	container := corev1.Container{
		Name:  ingestContainer,
		Image: image,
		Args: []string{
			"ingest",
			fmt.Sprintf("--listen=0.0.0.0:%d", ingestPort),
			// A change of the pool's size changes the args and so rolls
			// the ingestion pods onto the new membership.
			"--replicas=" + strings.Join(replicaAddrs(pool), ","),
			fmt.Sprintf("--metrics-listen=0.0.0.0:%d", metricsPort),
		},
		Ports: []corev1.ContainerPort{
			{Name: ingestPortName, ContainerPort: ingestPort, Protocol: corev1.ProtocolTCP},
			{Name: metricsPortName, ContainerPort: metricsPort, Protocol: corev1.ProtocolTCP},
		},
		Resources:       resources,
		ReadinessProbe:  tcpProbe(ingestPortName),
		LivenessProbe:   tcpProbe(ingestPortName),
		SecurityContext: restrictedContainer(),
	}

	podSpec := corev1.PodSpec{
		Containers: []corev1.Container{container},
		// Ingestion pods are stateless and interchangeable: spread them
		// when the cluster allows, but never leave one pending for it.
		Affinity:        spreadWhenPossible(ingestSelectorLabels(stream)),
		SecurityContext: restrictedPod(),
	}

	d := &appsv1.Deployment{
		TypeMeta: metav1.TypeMeta{APIVersion: appsv1.SchemeGroupVersion.String(), Kind: "Deployment"},
		ObjectMeta: metav1.ObjectMeta{
			Name:      stream.IngestName(),
			Namespace: stream.Namespace,
			Labels:    ingestLabels(stream),
		},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To(replicas),
			Selector: &metav1.LabelSelector{MatchLabels: ingestSelectorLabels(stream)},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: ingestLabels(stream)},
				Spec:       podSpec,
			},
		},
	}
	applyPodOptions(&d.Spec.Template, stream.Spec.Pod)
	return d
}

// desiredIngestService is the ClusterIP Service producers and consumers
// connect to, named after the Stream. Unlike the pool's headless Service
// it sends clients to ready pods only.
func desiredIngestService(stream *streamsv1alpha1.Stream) *corev1.Service {
	return &corev1.Service{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
		ObjectMeta: metav1.ObjectMeta{
			Name:      stream.IngestServiceName(),
			Namespace: stream.Namespace,
			Labels:    ingestLabels(stream),
		},
		Spec: corev1.ServiceSpec{
			Type:     corev1.ServiceTypeClusterIP,
			Selector: ingestSelectorLabels(stream),
			Ports:    []corev1.ServicePort{namedPort(ingestPortName, ingestPort)},
		},
	}
}

// desiredIngestPDB lets voluntary disruptions take at most one ingestion
// pod at a time. With a single replica it blocks nothing, so it needs no
// special case when replicas is 1.
func desiredIngestPDB(stream *streamsv1alpha1.Stream) *policyv1.PodDisruptionBudget {
	return oneAtATime(stream.Namespace, stream.IngestName(), ingestLabels(stream), ingestSelectorLabels(stream))
}

// externalServiceSuffix names a Stream's external Service.
const externalServiceSuffix = "-external"

// desiredExternalService is the Service that exposes a Stream's ingestion
// outside the cluster (spec.ingestion.external), nil when it has none.
// Its traffic policy is Cluster: any node's port (or the load balancer)
// reaches any ready ingestion pod.
func desiredExternalService(stream *streamsv1alpha1.Stream) *corev1.Service {
	ext := stream.Spec.Ingestion.External
	if ext == nil {
		return nil
	}
	port := namedPort(ingestPortName, ingestPort)
	if ext.Type == corev1.ServiceTypeNodePort {
		port.NodePort = ext.NodePort
	}
	return &corev1.Service{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
		ObjectMeta: metav1.ObjectMeta{
			Name:        stream.IngestServiceName() + externalServiceSuffix,
			Namespace:   stream.Namespace,
			Labels:      ingestLabels(stream),
			Annotations: ext.Annotations,
		},
		Spec: corev1.ServiceSpec{
			Type:                     ext.Type,
			Selector:                 ingestSelectorLabels(stream),
			Ports:                    []corev1.ServicePort{port},
			ExternalTrafficPolicy:    corev1.ServiceExternalTrafficPolicyCluster,
			LoadBalancerSourceRanges: ext.LoadBalancerSourceRanges,
		},
	}
}

// externalEndpoint is the host:port clients outside the cluster use, from
// the external Service as the API server holds it and the host addresses
// of the ready ingestion pods (sorted): "" until Kubernetes has given a
// port (NodePort) or an address (LoadBalancer).
func externalEndpoint(ext *streamsv1alpha1.ExternalListener, svc *corev1.Service, hostIPs []string) string {
	if ext == nil || svc == nil || len(svc.Spec.Ports) == 0 {
		return ""
	}
	switch svc.Spec.Type {
	case corev1.ServiceTypeNodePort:
		port := svc.Spec.Ports[0].NodePort
		host := ext.AdvertisedHost
		if host == "" && len(hostIPs) > 0 {
			host = hostIPs[0]
		}
		if port == 0 || host == "" {
			return ""
		}
		return net.JoinHostPort(host, strconv.Itoa(int(port)))
	case corev1.ServiceTypeLoadBalancer:
		host := ext.AdvertisedHost
		for _, in := range svc.Status.LoadBalancer.Ingress {
			if host != "" {
				break
			}
			host = cmp.Or(in.Hostname, in.IP)
		}
		if host == "" {
			return ""
		}
		return net.JoinHostPort(host, strconv.Itoa(int(svc.Spec.Ports[0].Port)))
	}
	return ""
}

// podReady reports whether pod's Ready condition is True.
func podReady(pod *corev1.Pod) bool {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
