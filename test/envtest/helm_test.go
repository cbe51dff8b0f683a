package envtest_test

import (
	"bytes"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/catena-streams/catena/rpc/transport"
)

// chartDir is the Helm chart, relative to this package.
var chartDir = filepath.Join(repoRoot, "charts", "catena")

// chartTestFieldOwner is the field manager of these specs' server-side
// applies (the CRDs over the suite's, config/default's objects).
const chartTestFieldOwner = "catena-chart-test"

// What `helm install` puts in a cluster must be accepted by a real API
// server, keep the operator unprivileged, and grant exactly the RBAC that
// the controllers' markers generate.
var _ = Describe("Helm chart", func() {
	It("renders objects that the API server accepts", func() {
		ns := newNamespace()
		const (
			repository = "registry.example.com/catena"
			tag        = "v9.9.9"
			image      = repository + ":" + tag
		)
		// The namespace doubles as the release name, so that the
		// cluster-scoped names are the spec's own.
		objs := helmTemplate(ns, ns, "--include-crds", "--set", "image.repository="+repository, "--set", "image.tag="+tag)

		kinds := map[string]int{}
		byKind := map[string]*unstructured.Unstructured{}
		for _, obj := range objs {
			kinds[obj.GetKind()]++
			byKind[obj.GetKind()] = obj
			if obj.GetKind() == "CustomResourceDefinition" {
				expectInstalledCRD(obj)
				continue
			}
			namespaced, err := k8s.IsObjectNamespaced(obj)
			Expect(err).NotTo(HaveOccurred(), "%s %s", obj.GetKind(), obj.GetName())
			if namespaced {
				// `helm template | kubectl apply` must not depend on the
				// current context's namespace.
				Expect(obj.GetNamespace()).To(Equal(ns), "%s %s has no namespace of its own", obj.GetKind(), obj.GetName())
			}
			Expect(k8s.Create(ctx, obj)).To(Succeed(), "%s %s", obj.GetKind(), obj.GetName())
		}
		crds, err := filepath.Glob(filepath.Join(repoRoot, "config", "crd", "bases", "*.yaml"))
		Expect(err).NotTo(HaveOccurred())
		Expect(kinds).To(Equal(map[string]int{
			"CustomResourceDefinition": len(crds),
			"ServiceAccount":           1,
			"ClusterRole":              1,
			"ClusterRoleBinding":       1,
			"Role":                     1,
			"RoleBinding":              1,
			"Deployment":               1,
			"Service":                  1,
		}))

		By("running the operator unprivileged, with the chart's image for the pods it creates")
		var deploy appsv1.Deployment
		Expect(k8s.Get(ctx, objectKey(byKind["Deployment"]), &deploy)).To(Succeed())
		Expect(deploy.Spec.Replicas).To(HaveValue(BeEquivalentTo(1)))
		pod := deploy.Spec.Template.Spec
		Expect(pod.ServiceAccountName).To(Equal(byKind["ServiceAccount"].GetName()))
		Expect(pod.SecurityContext).NotTo(BeNil())
		Expect(pod.SecurityContext.RunAsNonRoot).To(HaveValue(BeTrue()))
		Expect(pod.SecurityContext.RunAsUser).To(HaveValue(BeEquivalentTo(65532)))
		Expect(pod.SecurityContext.SeccompProfile).To(HaveValue(HaveField("Type", corev1.SeccompProfileTypeRuntimeDefault)))
		Expect(pod.Containers).To(HaveLen(1))
		c := pod.Containers[0]
		Expect(c.SecurityContext).NotTo(BeNil())
		Expect(c.SecurityContext.RunAsNonRoot).To(HaveValue(BeTrue()))
		Expect(c.SecurityContext.RunAsUser).To(HaveValue(BeEquivalentTo(65532)))
		Expect(c.SecurityContext.ReadOnlyRootFilesystem).To(HaveValue(BeTrue()))
		Expect(c.SecurityContext.AllowPrivilegeEscalation).To(HaveValue(BeFalse()))
		Expect(c.SecurityContext.Capabilities).To(HaveValue(HaveField("Drop", ConsistOf(corev1.Capability("ALL")))))
		Expect(c.Image).To(Equal(image))
		Expect(c.Args).To(HaveExactElements("operator", "--image="+image, "--metrics-bind-address=:8080",
			"--health-probe-bind-address=:8081", "--leader-elect", "--leader-elect-lease-duration=15s",
			"--leader-elect-renew-deadline=10s", "--leader-elect-retry-period=2s",
			"--certificates=operator", "--ca-secret=catena-ca", "--certificate-lifetime=2160h", "--verbosity=0"))
		Expect(c.Env).To(ContainElement(HaveField("Name", "POD_NAMESPACE")), "the operator's namespace, for its CA Secret")
		Expect(c.LivenessProbe.HTTPGet).To(HaveField("Path", "/healthz"))
		Expect(c.ReadinessProbe.HTTPGet).To(HaveField("Path", "/readyz"))
		Expect(c.Ports).To(ContainElement(SatisfyAll(HaveField("Name", "probes"), HaveField("ContainerPort", BeEquivalentTo(8081)))))
		Expect(c.Resources.Requests).NotTo(BeEmpty())

		By("granting the rules of config/rbac/role.yaml cluster-wide")
		var generated rbacv1.ClusterRole
		data, err := os.ReadFile(filepath.Join(repoRoot, "config", "rbac", "role.yaml"))
		Expect(err).NotTo(HaveOccurred())
		Expect(yaml.Unmarshal(data, &generated)).To(Succeed())
		Expect(generated.Rules).NotTo(BeEmpty())
		var role rbacv1.ClusterRole
		Expect(k8s.Get(ctx, objectKey(byKind["ClusterRole"]), &role)).To(Succeed())
		Expect(role.Rules).To(Equal(generated.Rules))
		var binding rbacv1.ClusterRoleBinding
		Expect(k8s.Get(ctx, objectKey(byKind["ClusterRoleBinding"]), &binding)).To(Succeed())
		Expect(binding.RoleRef.Name).To(Equal(role.Name))
		Expect(binding.Subjects).To(ConsistOf(rbacv1.Subject{Kind: "ServiceAccount", Name: pod.ServiceAccountName, Namespace: ns}))

		By("granting leader election in the release namespace only")
		var election rbacv1.Role
		Expect(k8s.Get(ctx, objectKey(byKind["Role"]), &election)).To(Succeed())
		Expect(election.Rules).To(ContainElement(SatisfyAll(
			HaveField("APIGroups", ConsistOf("coordination.k8s.io")),
			HaveField("Resources", ConsistOf("leases")),
			HaveField("Verbs", ContainElements("get", "create", "update")),
		)))
		var electionBinding rbacv1.RoleBinding
		Expect(k8s.Get(ctx, objectKey(byKind["RoleBinding"]), &electionBinding)).To(Succeed())
		Expect(electionBinding.RoleRef.Name).To(Equal(election.Name))
		Expect(electionBinding.Subjects).To(ConsistOf(rbacv1.Subject{Kind: "ServiceAccount", Name: pod.ServiceAccountName, Namespace: ns}))

		By("serving metrics on 8080")
		var svc corev1.Service
		Expect(k8s.Get(ctx, objectKey(byKind["Service"]), &svc)).To(Succeed())
		Expect(svc.Spec.Ports).To(ConsistOf(SatisfyAll(HaveField("Name", "metrics"), HaveField("Port", BeEquivalentTo(8080)))))
		Expect(svc.Spec.Selector).To(Equal(deploy.Spec.Selector.MatchLabels))
	})

	It("runs the image of the chart's appVersion by default", func() {
		var chart struct {
			AppVersion string `json:"appVersion"`
		}
		data, err := os.ReadFile(filepath.Join(chartDir, "Chart.yaml"))
		Expect(err).NotTo(HaveOccurred())
		Expect(yaml.Unmarshal(data, &chart)).To(Succeed())
		Expect(chart.AppVersion).NotTo(BeEmpty())

		var deploys []*unstructured.Unstructured
		for _, obj := range helmTemplate("catena", "catena-system") {
			if obj.GetKind() == "Deployment" {
				deploys = append(deploys, obj)
			}
		}
		Expect(deploys).To(HaveLen(1))
		containers, _, err := unstructured.NestedSlice(deploys[0].Object, "spec", "template", "spec", "containers")
		Expect(err).NotTo(HaveOccurred())
		Expect(containers).To(HaveLen(1))
		image := "catena:" + chart.AppVersion
		Expect(containers[0]).To(HaveKeyWithValue("image", image))
		Expect(containers[0]).To(HaveKeyWithValue("args", ContainElement("--image="+image)))
	})

	It("ships the CRDs of config/crd/bases unchanged", func() {
		want, err := filepath.Glob(filepath.Join(repoRoot, "config", "crd", "bases", "*.yaml"))
		Expect(err).NotTo(HaveOccurred())
		Expect(want).NotTo(BeEmpty())
		got, err := filepath.Glob(filepath.Join(chartDir, "crds", "*.yaml"))
		Expect(err).NotTo(HaveOccurred())
		Expect(names(got)).To(Equal(names(want)), "run make manifests")
		for _, file := range want {
			a, err := os.ReadFile(file)
			Expect(err).NotTo(HaveOccurred())
			b, err := os.ReadFile(filepath.Join(chartDir, "crds", filepath.Base(file)))
			Expect(err).NotTo(HaveOccurred())
			Expect(string(b)).To(Equal(string(a)), "charts/catena/crds/%s is stale: run make manifests", filepath.Base(file))
		}
	})

	It("creates Prometheus Operator monitors for the operator and every pod it runs when asked", func() {
		Expect(helmTemplate("catena", "catena-system")).NotTo(ContainElement(WithTransform(
			func(o *unstructured.Unstructured) string { return o.GetAPIVersion() }, Equal("monitoring.coreos.com/v1"))), "off by default")
		byKind := map[string]*unstructured.Unstructured{}
		for _, obj := range helmTemplate("catena", "catena-system", "--set", "metrics.serviceMonitor.enabled=true",
			"--set", "metrics.podMonitor.enabled=true", "--set", "metrics.podMonitor.labels.release=prom", "--set", "watchNamespaces={shop,billing}") {
			byKind[obj.GetKind()] = obj
		}
		Expect(byKind).To(HaveKey("ServiceMonitor"))
		Expect(byKind).To(HaveKey("PodMonitor"))
		var svc *unstructured.Unstructured
		for _, obj := range helmTemplate("catena", "catena-system") {
			if obj.GetKind() == "Service" {
				svc = obj
			}
		}
		Expect(svc).NotTo(BeNil())
		sel, _, _ := unstructured.NestedStringMap(byKind["ServiceMonitor"].Object, "spec", "selector", "matchLabels")
		Expect(labels.SelectorFromSet(sel).Matches(labels.Set(svc.GetLabels()))).To(BeTrue(), "the ServiceMonitor selects the metrics Service: %v vs %v", sel, svc.GetLabels())
		ports, _, _ := unstructured.NestedSlice(svc.Object, "spec", "ports")
		Expect(ports).To(ContainElement(HaveKeyWithValue("name", "metrics")))

		pm := byKind["PodMonitor"]
		Expect(pm.GetLabels()).To(HaveKeyWithValue("release", "prom"))
		ns, _, _ := unstructured.NestedStringSlice(pm.Object, "spec", "namespaceSelector", "matchNames")
		Expect(ns).To(Equal([]string{"shop", "billing"}))
		// What it selects is what the operator's pods carry
		// (controllers: TestOperandPodsAreScraped).
		Expect(pm.Object["spec"]).To(HaveKeyWithValue("selector", map[string]any{
			"matchLabels": map[string]any{"app.kubernetes.io/name": "catena"},
			"matchExpressions": []any{map[string]any{"key": "app.kubernetes.io/component", "operator": "In",
				"values": []any{"replica", "ingest", "aggregator"}}},
		}))
		Expect(pm.Object["spec"]).To(HaveKeyWithValue("podMetricsEndpoints", ConsistOf(HaveKeyWithValue("port", "metrics"))))
		// The operator's series carry the namespace of what they count.
		Expect(byKind["ServiceMonitor"].Object["spec"]).To(HaveKeyWithValue("endpoints", ConsistOf(HaveKeyWithValue("honorLabels", true))))

		By("scraping over HTTPS with metrics.tls, verified against the operator's CA bundle")
		var tlsPM, operator *unstructured.Unstructured
		for _, obj := range helmTemplate("catena", "catena-system", "--set", "metrics.podMonitor.enabled=true", "--set", "metrics.tls.enabled=true") {
			switch obj.GetKind() {
			case "PodMonitor":
				tlsPM = obj
			case "Deployment":
				operator = obj
			}
		}
		Expect(tlsPM).NotTo(BeNil())
		Expect(tlsPM.Object["spec"]).To(HaveKeyWithValue("podMetricsEndpoints", ConsistOf(SatisfyAll(
			HaveKeyWithValue("scheme", "https"),
			HaveKeyWithValue("tlsConfig", map[string]any{
				"ca":         map[string]any{"configMap": map[string]any{"name": "catena-ca-bundle", "key": "ca.crt"}},
				"serverName": transport.MetricsServerName,
			})))))
		containers, _, _ := unstructured.NestedSlice(operator.Object, "spec", "template", "spec", "containers")
		Expect(containers[0]).To(HaveKeyWithValue("args", ContainElement("--metrics-tls")))
		_, stderr, err := runHelm("template", "catena", chartDir, "--namespace", "catena-system", "--set", "metrics.tls.enabled=true", "--set", "tls.certificates=none")
		Expect(err).To(HaveOccurred())
		Expect(stderr).To(ContainSubstring("metrics.tls.enabled needs tls.certificates: operator"))

		By("shipping the Grafana dashboard for the sidecar, as the JSON in the chart")
		var dashboard *unstructured.Unstructured
		for _, obj := range helmTemplate("catena", "catena-system", "--set", "grafana.dashboard.enabled=true") {
			if obj.GetKind() == "ConfigMap" && obj.GetName() == "catena-dashboard" {
				dashboard = obj
			}
		}
		Expect(dashboard).NotTo(BeNil())
		Expect(dashboard.GetLabels()).To(HaveKeyWithValue("grafana_dashboard", "1"))
		data, _, _ := unstructured.NestedStringMap(dashboard.Object, "data")
		want, err := os.ReadFile(filepath.Join(chartDir, "dashboards", "catena.json"))
		Expect(err).NotTo(HaveOccurred())
		Expect(data["catena.json"]).To(MatchJSON(want))
		Expect(k8s.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "default", GenerateName: "dashboard-"},
			Data: map[string]string{"catena.json": data["catena.json"]}})).To(Succeed(), "the API server takes it (size)")
	})

	It("hands certificates to cert-manager with tls.certificates: cert-manager", func() {
		var deploy appsv1.Deployment
		var role rbacv1.Role
		for _, obj := range helmTemplate("catena", "catena-system", "--set", "tls.certificates=cert-manager", "--set", "tls.issuer.name=corp-ca",
			"--set", "tls.issuer.kind=Issuer", "--set", "metrics.tls.enabled=true") {
			switch obj.GetKind() {
			case "Deployment":
				Expect(runtime.DefaultUnstructuredConverter.FromUnstructured(obj.Object, &deploy)).To(Succeed())
			case "Role":
				Expect(runtime.DefaultUnstructuredConverter.FromUnstructured(obj.Object, &role)).To(Succeed())
			}
		}
		Expect(deploy.Spec.Template.Spec.Containers[0].Args).To(ContainElements("--certificates=cert-manager", "--issuer-name=corp-ca",
			"--issuer-kind=Issuer", "--issuer-group=cert-manager.io", "--ca-secret=catena-ca", "--metrics-tls"))
		Expect(role.Rules).To(ContainElement(rbacv1.PolicyRule{APIGroups: []string{"cert-manager.io"}, Resources: []string{"certificates"},
			Verbs: []string{"get", "create", "update"}}), "the operator's own Certificate, in its namespace")

		_, stderr, err := runHelm("template", "catena", chartDir, "--namespace", "catena-system", "--set", "tls.certificates=cert-manager")
		Expect(err).To(HaveOccurred())
		Expect(stderr).To(ContainSubstring("tls.certificates: cert-manager needs tls.issuer.name"))
	})

	It("turns on the operator's NetworkPolicies with the labels of its own pods", func() {
		var deploy appsv1.Deployment
		for _, obj := range helmTemplate("catena", "catena-system", "--set", "networkPolicy.enabled=true") {
			if obj.GetKind() == "Deployment" {
				Expect(runtime.DefaultUnstructuredConverter.FromUnstructured(obj.Object, &deploy)).To(Succeed())
			}
		}
		c := deploy.Spec.Template.Spec.Containers[0]
		Expect(c.Args).To(ContainElement("--network-policies"))
		var flag string
		for _, a := range c.Args {
			if v, ok := strings.CutPrefix(a, "--operator-pod-labels="); ok {
				flag = v
			}
		}
		sel, err := labels.Parse(flag)
		Expect(err).NotTo(HaveOccurred(), "--operator-pod-labels=%s", flag)
		Expect(sel.Matches(labels.Set(deploy.Spec.Template.Labels))).To(BeTrue(), "%s selects the operator's pods %v", flag, deploy.Spec.Template.Labels)
		Expect(c.Env).To(ContainElement(HaveField("Name", "POD_NAMESPACE")))
	})

	DescribeTable("rejects invalid values with the schema's message",
		func(set, message string) {
			_, stderr, err := runHelm("template", "catena", chartDir, "--namespace", "catena-system", "--set", set)
			Expect(err).To(HaveOccurred(), "helm template accepted --set %s", set)
			Expect(stderr).To(ContainSubstring("values don't meet the specifications of the schema"))
			Expect(stderr).To(ContainSubstring(message))
			GinkgoWriter.Printf("rejected: %s\n", stderr)
		},
		Entry("a negative replicaCount", "replicaCount=-1", "at '/replicaCount': minimum: got -1, want 0"),
		Entry("an unknown key", "replicaCont=2", "additional properties 'replicaCont' not allowed"),
		Entry("an unknown key in image", "image.name=catena", "at '/image': additional properties 'name' not allowed"),
		Entry("an unknown pull policy", "image.pullPolicy=Sometimes", "at '/image/pullPolicy': value must be one of"),
		Entry("a port out of range", "metrics.service.port=70000", "at '/metrics/service/port': maximum"),
		Entry("an unknown certificate issuer", "tls.certificates=vault", "at '/tls/certificates': value must be one of"),
	)
})

// config/default is the other way to install the operator: it must give
// the same operator as the chart's defaults.
var _ = Describe("config/default", func() {
	It("renders with kubectl kustomize into objects that the API server accepts, like the chart's", func() {
		kubectl := filepath.Join(testEnv.BinaryAssetsDirectory, "kubectl")
		Expect(kubectl).To(BeAnExistingFile(), "hack/k8s-binaries.sh builds kubectl beside kube-apiserver")
		var stdout, stderr bytes.Buffer
		cmd := exec.CommandContext(ctx, kubectl, "kustomize", filepath.Join(repoRoot, "config", "default"))
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		Expect(cmd.Run()).To(Succeed(), "kubectl kustomize: %s", stderr.String())

		byKind := map[string]*unstructured.Unstructured{}
		for _, obj := range decodeManifests(stdout.String()) {
			if obj.GetKind() == "CustomResourceDefinition" {
				expectInstalledCRD(obj)
				continue
			}
			byKind[obj.GetKind()] = obj
			// Its names are fixed (namespace catena-system), so apply
			// rather than create: the spec may run again on the same
			// API server.
			Expect(k8s.Apply(ctx, client.ApplyConfigurationFromUnstructured(obj.DeepCopy()),
				client.FieldOwner(chartTestFieldOwner), client.ForceOwnership)).To(Succeed(), "%s %s", obj.GetKind(), obj.GetName())
		}
		Expect(byKind).To(HaveKey("Namespace"))
		Expect(byKind["Namespace"].GetName()).To(Equal("catena-system"))

		var deploy appsv1.Deployment
		Expect(k8s.Get(ctx, objectKey(byKind["Deployment"]), &deploy)).To(Succeed())
		var role rbacv1.ClusterRole
		Expect(k8s.Get(ctx, objectKey(byKind["ClusterRole"]), &role)).To(Succeed())
		var binding rbacv1.ClusterRoleBinding
		Expect(k8s.Get(ctx, objectKey(byKind["ClusterRoleBinding"]), &binding)).To(Succeed())
		Expect(binding.RoleRef.Name).To(Equal(role.Name))
		Expect(binding.Subjects).To(ConsistOf(rbacv1.Subject{Kind: "ServiceAccount", Name: byKind["ServiceAccount"].GetName(), Namespace: "catena-system"}))
		var electionBinding rbacv1.RoleBinding
		Expect(k8s.Get(ctx, objectKey(byKind["RoleBinding"]), &electionBinding)).To(Succeed())
		Expect(electionBinding.RoleRef.Name).To(Equal(byKind["Role"].GetName()))

		By("matching the chart's operator and RBAC")
		var chartDeploy appsv1.Deployment
		var chartRole rbacv1.ClusterRole
		for _, obj := range helmTemplate("catena", "catena-system") {
			switch obj.GetKind() {
			case "Deployment":
				Expect(runtime.DefaultUnstructuredConverter.FromUnstructured(obj.Object, &chartDeploy)).To(Succeed())
			case "ClusterRole":
				Expect(runtime.DefaultUnstructuredConverter.FromUnstructured(obj.Object, &chartRole)).To(Succeed())
			}
		}
		Expect(role.Rules).To(Equal(chartRole.Rules))
		pod, chartPod := deploy.Spec.Template.Spec, chartDeploy.Spec.Template.Spec
		Expect(pod.SecurityContext).To(Equal(chartPod.SecurityContext))
		Expect(pod.Containers).To(HaveLen(1))
		Expect(chartPod.Containers).To(HaveLen(1))
		c, chartC := pod.Containers[0], chartPod.Containers[0]
		Expect(c.SecurityContext).To(Equal(chartC.SecurityContext))
		Expect(c.Image).To(Equal(chartC.Image))
		Expect(chartC.Args).To(HaveExactElements(append(c.Args, "--ca-secret=catena-ca", "--certificate-lifetime=2160h", "--verbosity=0")),
			"the chart adds only --verbosity and its CA settings' defaults")
		Expect(c.Env).To(HaveLen(1))
		Expect(chartC.Env).To(ConsistOf(SatisfyAll(HaveField("Name", c.Env[0].Name), HaveField("ValueFrom.FieldRef.FieldPath", c.Env[0].ValueFrom.FieldRef.FieldPath))))
		Expect(c.Resources).To(Equal(chartC.Resources))
	})
})

// helmTemplate renders the chart as release in namespace, and decodes
// every object of the output.
func helmTemplate(release, namespace string, args ...string) []*unstructured.Unstructured {
	stdout, stderr, err := runHelm(append([]string{"template", release, chartDir, "--namespace", namespace}, args...)...)
	ExpectWithOffset(1, err).NotTo(HaveOccurred(), "helm template failed: %s", stderr)
	return decodeManifests(stdout)
}

// decodeManifests decodes every object of a multi-document YAML stream.
func decodeManifests(stdout string) []*unstructured.Unstructured {
	var objs []*unstructured.Unstructured
	dec := utilyaml.NewYAMLOrJSONDecoder(strings.NewReader(stdout), 4096)
	for {
		obj := &unstructured.Unstructured{}
		err := dec.Decode(&obj.Object)
		if errors.Is(err, io.EOF) {
			break
		}
		ExpectWithOffset(2, err).NotTo(HaveOccurred(), "bad YAML:\n%s", stdout)
		if len(obj.Object) == 0 {
			continue // an empty document, e.g. a disabled template
		}
		objs = append(objs, obj)
	}
	ExpectWithOffset(2, objs).NotTo(BeEmpty())
	return objs
}

// expectInstalledCRD applies a CRD of the chart over the one the suite
// installed from config/crd/bases: the API server must take it, and its
// generation must not move, because the spec is the same.
func expectInstalledCRD(obj *unstructured.Unstructured) {
	// Unstructured, because the suite's scheme has no apiextensions kinds.
	before := &unstructured.Unstructured{}
	before.SetGroupVersionKind(obj.GroupVersionKind())
	ExpectWithOffset(1, k8s.Get(ctx, objectKey(obj), before)).To(Succeed(), "the chart has a CRD that config/crd/bases has not: %s", obj.GetName())
	ExpectWithOffset(1, k8s.Apply(ctx, client.ApplyConfigurationFromUnstructured(obj.DeepCopy()),
		client.FieldOwner(chartTestFieldOwner), client.ForceOwnership)).To(Succeed(), "CRD %s", obj.GetName())
	after := &unstructured.Unstructured{}
	after.SetGroupVersionKind(obj.GroupVersionKind())
	ExpectWithOffset(1, k8s.Get(ctx, objectKey(obj), after)).To(Succeed())
	ExpectWithOffset(1, after.GetGeneration()).To(Equal(before.GetGeneration()), "the chart's CRD %s differs from config/crd/bases", obj.GetName())
}

// runHelm runs the helm that helmBinary finds.
func runHelm(args ...string) (stdout, stderr string, err error) {
	var out, errOut bytes.Buffer
	cmd := exec.CommandContext(ctx, helmBinary(), args...)
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err = cmd.Run()
	return out.String(), errOut.String(), err
}

// helmBinary is HELM when set, otherwise the helm hack/helm.sh builds
// into its cache (it returns at once when helm is already built).
func helmBinary() string {
	if path := os.Getenv("HELM"); path != "" {
		return path
	}
	var stdout bytes.Buffer
	cmd := exec.Command(filepath.Join(repoRoot, "hack", "helm.sh"))
	cmd.Stdout, cmd.Stderr = &stdout, GinkgoWriter
	ExpectWithOffset(2, cmd.Run()).To(Succeed(), "hack/helm.sh failed; its output is above")
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	path := lines[len(lines)-1]
	ExpectWithOffset(2, path).To(BeAnExistingFile(), "hack/helm.sh printed %q", path)
	return path
}

// objectKey names obj for a Get.
func objectKey(obj *unstructured.Unstructured) types.NamespacedName {
	return types.NamespacedName{Namespace: obj.GetNamespace(), Name: obj.GetName()}
}

// names are the base names of files.
func names(files []string) []string {
	out := make([]string, len(files))
	for i, f := range files {
		out[i] = filepath.Base(f)
	}
	return out
}
