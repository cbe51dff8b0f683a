package controllers

import (
	"net"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

	streamsv1alpha1 "github.com/catena-streams/catena/api/v1alpha1"
	"github.com/catena-streams/catena/internal/pki"
	"github.com/catena-streams/catena/rpc/transport"
)

// What the operator issues and how pods use it (docs/security.md). Every
// function here is pure: the reconcilers pass the results to
// Certificates.ensureLeaf and to the pod templates.

// Identities: spiffe://catena/ns/<namespace>/<role>/<name>.
func identity(namespace string, parts ...string) string {
	return "spiffe://catena/ns/" + namespace + "/" + strings.Join(parts, "/")
}

// OperatorIdentity is the identity of the operator running in namespace.
func OperatorIdentity(namespace string) string { return identity(namespace, "operator") }

func poolIdentity(pool *streamsv1alpha1.ReplicaPool) string {
	return identity(pool.Namespace, "pool", pool.Name)
}

func ingestIdentity(stream *streamsv1alpha1.Stream) string {
	return identity(stream.Namespace, "ingest", stream.Name)
}

func userIdentity(stream *streamsv1alpha1.Stream, user string) string {
	return identity(stream.Namespace, "stream", stream.Name, "user", user)
}

func workersIdentity(agg *streamsv1alpha1.Aggregation) string {
	return identity(agg.Namespace, "aggregation", agg.Name)
}

// allIngestion and allWorkers admit every ingestion node, and every
// aggregation worker, of a namespace.
func allIngestion(namespace string) string {
	return identity(namespace, "ingest") + transport.PrefixWildcard
}

func allWorkers(namespace string) string {
	return identity(namespace, "aggregation") + transport.PrefixWildcard
}

// serviceNames are the names a Service is reached at from inside the
// cluster, in the forms a client may dial.
func serviceNames(svc, namespace string) []string {
	return []string{svc, svc + "." + namespace, svc + "." + namespace + ".svc", svc + "." + namespace + ".svc.cluster.local"}
}

// podNames are the names of a headless Service's pods.
func podNames(svc, namespace string) []string {
	return []string{"*." + svc + "." + namespace + ".svc", "*." + svc + "." + namespace + ".svc.cluster.local"}
}

// poolLeaf is the certificate of a pool's replicas: served to their peers,
// ingestion and the operator at <pod>.<service>.<namespace>.svc, and
// presented on their links to one another.
func poolLeaf(pool *streamsv1alpha1.ReplicaPool) pki.Leaf {
	return pki.Leaf{Identity: poolIdentity(pool), DNSNames: append(podNames(pool.ServiceName(), pool.Namespace), transport.MetricsServerName)}
}

// ingestLeaf is the certificate of a Stream's ingestion pods: served to
// clients at the ingestion Service and at the external listener's address
// (its advertisedHost, else the address status reports), and presented to
// replicas.
func ingestLeaf(stream *streamsv1alpha1.Stream) pki.Leaf {
	l := pki.Leaf{Identity: ingestIdentity(stream), DNSNames: append(serviceNames(stream.IngestServiceName(), stream.Namespace), transport.MetricsServerName)}
	if stream.HasKafka() {
		// Each pod is a broker under <IP with dashes>.<brokers Service>.
		l.DNSNames = append(l.DNSNames, podNames(stream.KafkaServiceName(), stream.Namespace)...)
	}
	var hosts []string
	if ext := stream.Spec.Ingestion.External; ext != nil {
		hosts = append(hosts, ext.AdvertisedHost)
		if h, _, err := net.SplitHostPort(stream.Status.Endpoints.External); err == nil {
			hosts = append(hosts, h)
		}
	}
	for _, h := range hosts {
		switch ip := net.ParseIP(h); {
		case h == "" || inCluster(h):
			// The API refuses such an advertisedHost: a certificate for
			// it would let the Stream's ingestion pose as another
			// namespace's Service.
		case ip != nil:
			if !slices.ContainsFunc(l.IPs, ip.Equal) {
				l.IPs = append(l.IPs, ip)
			}
		case !slices.Contains(l.DNSNames, h):
			l.DNSNames = append(l.DNSNames, h)
		}
	}
	return l
}

// inCluster reports whether a host name is one of the cluster's own:
// a Service or pod name (*.svc, *.cluster.local) or a single label.
func inCluster(h string) bool {
	h = strings.ToLower(strings.TrimSuffix(h, "."))
	return !strings.Contains(h, ".") || strings.HasSuffix(h, ".svc") || strings.Contains(h, ".svc.") || strings.HasSuffix(h, ".cluster.local")
}

// userLeaf is a Stream user's client certificate.
func userLeaf(stream *streamsv1alpha1.Stream, user string) pki.Leaf {
	return pki.Leaf{Identity: userIdentity(stream, user)}
}

// workersLeaf is the certificate of an Aggregation's workers: served to
// the operator and to one another at their pod names, to clients at the
// Aggregation's Service, and presented to ingestion.
func workersLeaf(agg *streamsv1alpha1.Aggregation) pki.Leaf {
	names := append(podNames(agg.WorkersName(), agg.Namespace), serviceNames(aggServiceName(agg), agg.Namespace)...)
	return pki.Leaf{Identity: workersIdentity(agg), DNSNames: append(names, transport.MetricsServerName)}
}

// Every server certificate also names transport.MetricsServerName, which a
// scraper that reaches pods by address verifies them with (--metrics-tls).

// Where a pod finds its certificate.
const (
	tlsVolume    = "tls"
	tlsMountPath = "/etc/catena/tls"
)

// mountTLS mounts secret into the pod's first container and passes it as
// --tls-cert, --tls-key and --tls-ca, then args. The files are re-read when
// the Secret changes (transport.TLSFiles), so a renewal needs no restart.
func mountTLS(spec *corev1.PodSpec, secret string, args ...string) {
	// The key is readable by the owner and the pod's group: the files
	// belong to fsGroup, the group the container runs as.
	if spec.SecurityContext == nil {
		spec.SecurityContext = &corev1.PodSecurityContext{}
	}
	if spec.SecurityContext.FSGroup == nil {
		spec.SecurityContext.FSGroup = ptr.To(replicaUID)
	}
	spec.Volumes = append(spec.Volumes, corev1.Volume{Name: tlsVolume, VolumeSource: corev1.VolumeSource{
		Secret: &corev1.SecretVolumeSource{SecretName: secret, DefaultMode: ptr.To[int32](0o440)},
	}})
	c := &spec.Containers[0]
	c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: tlsVolume, MountPath: tlsMountPath, ReadOnly: true})
	c.Args = append(c.Args,
		"--tls-cert="+tlsMountPath+"/"+pki.CertKey,
		"--tls-key="+tlsMountPath+"/"+pki.KeyKey,
		"--tls-ca="+tlsMountPath+"/"+pki.BundleKey)
	c.Args = append(c.Args, args...)
}

// replicaAccessArgs are a pool's --allow-* flags: admin calls from the
// operator only, replication from the pool's own replicas, appends and
// reads from the namespace's ingestion nodes (and the operator, which
// releases a deleted Aggregation's holds), status from all of those (not
// from Stream users, whose certificates come from the same CA). Naming
// ingestion by prefix keeps the replicas' pod template, and so the pods,
// unchanged as Streams come and go.
func replicaAccessArgs(pool *streamsv1alpha1.ReplicaPool, operator string) []string {
	data := allIngestion(pool.Namespace) + "," + operator
	return []string{
		"--allow-admin=" + operator,
		"--allow-replication=" + poolIdentity(pool),
		"--allow-data=" + data,
		"--allow-status=" + poolIdentity(pool) + "," + data,
	}
}

// ingestAccessArgs are a Stream's ingestion --stream and --allow-* flags,
// from its spec.access: nil is open to anyone; otherwise each user may do
// what it lists, the namespace's aggregation workers and the operator (and,
// with Kafka, the ingestion pods forwarding group requests) may consume
// and describe, and requests about any other Stream of the pool
// (workers write their checkpoint Streams through their source's
// ingestion) are allowed to the workers and the operator only.
func ingestAccessArgs(stream *streamsv1alpha1.Stream, operator string) []string {
	internal := []string{allWorkers(stream.Namespace), operator}
	if stream.HasKafka() {
		// A pod forwards a request about a consumer group to the pod
		// coordinating it, and asks every pod for their groups, with its
		// own identity, once it has admitted the caller.
		internal = append(internal, ingestIdentity(stream))
	}
	produce := streamUsers(stream, streamsv1alpha1.OperationProduce)
	consume := streamUsers(stream, streamsv1alpha1.OperationConsume)
	metadata := streamUsers(stream, "")
	if stream.Spec.Access != nil {
		consume = append(consume, internal...)
		metadata = append(metadata, internal...)
	}
	return []string{
		"--stream=" + stream.Name,
		"--allow-produce=" + strings.Join(produce, ","),
		"--allow-consume=" + strings.Join(consume, ","),
		"--allow-metadata=" + strings.Join(metadata, ","),
		"--allow-other-streams=" + strings.Join(internal, ","),
	}
}

// streamUsers are the identities of a Stream's users allowed op (""
// any): [anyone] when the Stream has no access list.
func streamUsers(stream *streamsv1alpha1.Stream, op streamsv1alpha1.StreamOperation) []string {
	a := stream.Spec.Access
	if a == nil {
		return []string{transport.Anyone}
	}
	var out []string
	for _, u := range a.Users {
		if op == "" || u.Allows(op) {
			out = append(out, userIdentity(stream, u.Name))
		}
	}
	return out
}

// workerAccessArgs are an Aggregation's workers' --allow-* flags: shards
// are assigned and their status read by the operator only; results are
// read by whoever may consume the source Stream, and by the Aggregation's
// own workers (a query fans out to the workers owning its keys).
func workerAccessArgs(agg *streamsv1alpha1.Aggregation, source *streamsv1alpha1.Stream, operator string) []string {
	query := append(streamUsers(source, streamsv1alpha1.OperationConsume), workersIdentity(agg))
	return []string{
		"--allow-admin=" + operator,
		"--allow-status=" + operator,
		"--allow-query=" + strings.Join(query, ","),
	}
}
