package controllers

import (
	"cmp"
	"fmt"
	"net"
	"slices"
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
	// kafkaPort serves Kafka clients (spec.ingestion.kafka), on the pods,
	// the ingestion Service and the headless Service naming the brokers.
	kafkaPort     int32 = 9092
	kafkaPortName       = "kafka"
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

// kafkaEndpoint is the in-cluster bootstrap address of a Stream's Kafka
// listener.
func kafkaEndpoint(stream *streamsv1alpha1.Stream) string {
	return fmt.Sprintf("%s.%s.svc:%d", stream.IngestServiceName(), stream.Namespace, kafkaPort)
}

// kafkaBrokerDomain is the domain under which each ingestion pod is a
// broker: <pod IP with dashes>.<domain>, a name the headless Service
// gives each ready pod.
func kafkaBrokerDomain(stream *streamsv1alpha1.Stream) string {
	return stream.KafkaServiceName() + "." + stream.Namespace + ".svc"
}

// ingestion is a Stream's ingestion tier: a Deployment of `catena ingest`
// pods, the ClusterIP Service clients connect to, and a
// PodDisruptionBudget; with Kafka, the headless Service of the brokers and
// the Stream of the consumer groups' offsets.
type ingestion struct {
	// Deployment is nil while the pool hosting the Stream is unknown: its
	// pods need the address of every replica.
	Deployment *appsv1.Deployment
	Service    *corev1.Service
	PDB        *policyv1.PodDisruptionBudget
	// External is the Service clients outside the cluster use (nil: the
	// Stream has no external listener).
	External *corev1.Service
	// Brokers is the headless Service naming the ingestion pods as Kafka
	// brokers and group coordinators, and Groups the Stream holding the
	// groups' committed offsets (both nil: no Kafka listener).
	Brokers *corev1.Service
	Groups  *streamsv1alpha1.Stream
}

// desiredIngestion builds a Stream's ingestion tier from its spec and the
// pool hosting it (nil when that pool does not exist or is not the
// Stream's to use). It reads nothing but its arguments; owner references
// are set by the caller.
func desiredIngestion(stream *streamsv1alpha1.Stream, pool *streamsv1alpha1.ReplicaPool, image string) ingestion {
	out := ingestion{Service: desiredIngestService(stream), PDB: desiredIngestPDB(stream), External: desiredExternalService(stream)}
	if stream.HasKafka() {
		out.Brokers = desiredKafkaBrokersService(stream)
		out.Groups = desiredGroupsStream(stream)
	}
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
			fmt.Sprintf("--listen=:%d", ingestPort),
			// A change of the pool's size changes the args and so rolls
			// the ingestion pods onto the new membership.
			"--replicas=" + strings.Join(replicaAddrs(pool), ","),
			fmt.Sprintf("--metrics-listen=:%d", metricsPort),
		},
		Ports: []corev1.ContainerPort{
			{Name: ingestPortName, ContainerPort: ingestPort, Protocol: corev1.ProtocolTCP},
			{Name: metricsPortName, ContainerPort: metricsPort, Protocol: corev1.ProtocolTCP},
		},
		Resources:       resources,
		ReadinessProbe:  tcpProbe(ingestPortName),
		Env:             kafkaEnv(stream),
		LivenessProbe:   tcpProbe(ingestPortName),
		SecurityContext: restrictedContainer(),
	}

	if stream.HasKafka() {
		container.Args = append(container.Args,
			fmt.Sprintf("--kafka-listen=:%d", kafkaPort),
			// Each pod is its own broker, at its own address: a group's
			// members must all reach its coordinator.
			fmt.Sprintf("--kafka-advertise=[$(%s)]:%d", podIPEnv, kafkaPort),
			// The headless Service resolves to the ready pods: the
			// nodes the groups are shared by.
			"--peers="+kafkaBrokerDomain(stream),
			"--groups-stream="+stream.GroupsStreamName())
		container.Ports = append(container.Ports, corev1.ContainerPort{Name: kafkaPortName, ContainerPort: kafkaPort, Protocol: corev1.ProtocolTCP})
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
			Ports:    ingestServicePorts(stream),
		},
	}
}

func ingestServicePorts(stream *streamsv1alpha1.Stream) []corev1.ServicePort {
	ports := []corev1.ServicePort{namedPort(ingestPortName, ingestPort)}
	if stream.HasKafka() {
		// The bootstrap address: any pod answers Metadata, which names
		// every pod as a broker.
		ports = append(ports, namedPort(kafkaPortName, kafkaPort))
	}
	return ports
}

// podIPEnv is the variable an ingestion pod's own IP is in (downward
// API): it advertises itself as a broker at that address.
const podIPEnv = "POD_IP"

func kafkaEnv(stream *streamsv1alpha1.Stream) []corev1.EnvVar {
	if !stream.HasKafka() {
		return nil
	}
	return []corev1.EnvVar{{Name: podIPEnv, ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.podIP"}}}}
}

// desiredKafkaBrokersService is the headless Service of a Stream's
// ingestion pods when they serve Kafka. Its name resolves to the ready
// pods' IPs (the nodes that share the groups: a pod that is not ready is
// not given groups), and names each of them
// <IP with dashes>.<service>.<namespace>.svc, the broker name clients
// are told with TLS (the pods' certificate holds *.<service>...).
func desiredKafkaBrokersService(stream *streamsv1alpha1.Stream) *corev1.Service {
	return &corev1.Service{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
		ObjectMeta: metav1.ObjectMeta{
			Name:      stream.KafkaServiceName(),
			Namespace: stream.Namespace,
			Labels:    ingestLabels(stream),
		},
		Spec: corev1.ServiceSpec{
			ClusterIP: corev1.ClusterIPNone,
			Selector:  ingestSelectorLabels(stream),
			Ports:     []corev1.ServicePort{namedPort(kafkaPortName, kafkaPort)},
		},
	}
}

// desiredGroupsStream is the Stream the consumer groups of a Stream's
// Kafka listener keep their committed offsets in: one partition (every
// commit in order), on the same pool with as many copies, fsynced, and no
// retention (a group that has not committed for a while keeps its
// offsets). Only Catena's own components reach it (empty access): the
// ingestion pods write it in-process. Its records share the Stream's
// fate: deleting the Stream deletes it, with the Stream's reclaim policy.
// Turning Kafka off later keeps it, so that turning it on again finds
// every group's offsets.
func desiredGroupsStream(stream *streamsv1alpha1.Stream) *streamsv1alpha1.Stream {
	return &streamsv1alpha1.Stream{
		TypeMeta: metav1.TypeMeta{APIVersion: streamsv1alpha1.GroupVersion.String(), Kind: "Stream"},
		ObjectMeta: metav1.ObjectMeta{
			Name:      stream.GroupsStreamName(),
			Namespace: stream.Namespace,
			Labels:    map[string]string{labelName: appName, labelManagedBy: fieldOwner, labelGroupsOf: stream.Name},
		},
		Spec: streamsv1alpha1.StreamSpec{
			// spec.pool or the Stream's own: immutable either way.
			Pool:                stream.PoolName(),
			Partitions:          1,
			ReplicationFactor:   stream.Spec.ReplicationFactor,
			MinChainLength:      stream.Spec.MinChainLength,
			Durability:          streamsv1alpha1.DurabilitySpec{Mode: streamsv1alpha1.DurabilityFsync},
			Ingestion:           streamsv1alpha1.IngestionSpec{Replicas: 1},
			Access:              &streamsv1alpha1.StreamAccess{},
			VolumeReclaimPolicy: stream.Spec.VolumeReclaimPolicy,
		},
	}
}

// labelGroupsOf marks a Stream of consumer group offsets with the Stream
// whose Kafka listener it serves.
const labelGroupsOf = "streams.catena.io/groups-of"

// ingestKafkaTLSArgs are the Kafka flags of ingestion pods with
// certificates: brokers are advertised under names the certificate holds,
// and a pod checks a peer it forwards a group's request to against the
// name the pods share.
func ingestKafkaTLSArgs(stream *streamsv1alpha1.Stream) []string {
	if !stream.HasKafka() {
		return nil
	}
	return []string{
		"--kafka-broker-domain=" + kafkaBrokerDomain(stream),
		"--peer-server-name=" + stream.IngestServiceName() + "." + stream.Namespace + ".svc",
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
// port (NodePort) or an address (LoadBalancer). previous is the address
// status reports now: a NodePort listener keeps its node while a ready
// ingestion pod still runs there, so that the address clients were given
// (and the certificates issued for it) does not move each time another
// pod becomes ready on a node that sorts first.
func externalEndpoint(ext *streamsv1alpha1.ExternalListener, svc *corev1.Service, hostIPs []string, previous string) string {
	if ext == nil || svc == nil || len(svc.Spec.Ports) == 0 {
		return ""
	}
	switch svc.Spec.Type {
	case corev1.ServiceTypeNodePort:
		port := svc.Spec.Ports[0].NodePort
		host := ext.AdvertisedHost
		if host == "" {
			if prev, _, err := net.SplitHostPort(previous); err == nil && slices.Contains(hostIPs, prev) {
				host = prev
			} else if len(hostIPs) > 0 {
				host = hostIPs[0]
			}
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

// ingestHosts are the host addresses of the ingestion pods that serve,
// sorted, each once: ready, and not being deleted (a pod in its grace
// period may still report Ready, and a client given its node would be
// moved again at once).
func ingestHosts(pods []corev1.Pod) []string {
	var hosts []string
	for i := range pods {
		p := &pods[i]
		if p.Status.HostIP != "" && p.DeletionTimestamp == nil && podReady(p) && !slices.Contains(hosts, p.Status.HostIP) {
			hosts = append(hosts, p.Status.HostIP)
		}
	}
	slices.Sort(hosts)
	return hosts
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
