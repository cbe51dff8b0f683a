// Command cert-manager-controller runs cert-manager's own controllers, built
// from the Go module github.com/cert-manager/cert-manager, for tests that
// need a real cert-manager and have no container images to pull.
//
// Upstream's main package lives in the separate module
// github.com/cert-manager/cert-manager/cmd/controller, which the module
// proxy does not serve, so this is a small stand-in for its app package: it
// builds a controller.ContextFactory, constructs the controllers below from
// the registry that their packages fill when imported, starts the shared
// informers and runs them until SIGTERM or SIGINT. It runs the Certificate
// controllers, the CertificateRequest approver, the CA and SelfSigned
// issuers and the Issuer/ClusterIssuer controllers; no ACME, Vault, Venafi,
// webhook, cainjector or leader election.
//
//	cert-manager-controller --kubeconfig=PATH [--cluster-resource-namespace=cert-manager] [-v=2]
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"golang.org/x/sync/errgroup"
	"k8s.io/klog/v2"

	"github.com/cert-manager/cert-manager/pkg/controller"
	"github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/approver"
	crca "github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/ca"
	crselfsigned "github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/selfsigned"
	"github.com/cert-manager/cert-manager/pkg/controller/certificates/issuing"
	"github.com/cert-manager/cert-manager/pkg/controller/certificates/keymanager"
	"github.com/cert-manager/cert-manager/pkg/controller/certificates/readiness"
	"github.com/cert-manager/cert-manager/pkg/controller/certificates/requestmanager"
	"github.com/cert-manager/cert-manager/pkg/controller/certificates/revisionmanager"
	"github.com/cert-manager/cert-manager/pkg/controller/certificates/trigger"
	"github.com/cert-manager/cert-manager/pkg/controller/clusterissuers"
	"github.com/cert-manager/cert-manager/pkg/controller/issuers"
	logf "github.com/cert-manager/cert-manager/pkg/logs"

	// Issuer implementations the issuers and clusterissuers controllers
	// set up (they register themselves with pkg/issuer).
	_ "github.com/cert-manager/cert-manager/pkg/issuer/ca"
	_ "github.com/cert-manager/cert-manager/pkg/issuer/selfsigned"
)

// enabled names the controllers this binary runs, as registered with
// controller.Register by the packages imported above.
var enabled = []string{
	trigger.ControllerName,
	issuing.ControllerName,
	keymanager.ControllerName,
	requestmanager.ControllerName,
	readiness.ControllerName,
	revisionmanager.ControllerName,
	// A CertificateRequest is signed only once approved; without this
	// controller every request the Certificate controllers make waits.
	approver.ControllerName,
	crca.CRControllerName,
	crselfsigned.CRControllerName,
	issuers.ControllerName,
	clusterissuers.ControllerName,
}

// workers is how many items each controller processes at once (upstream's
// default --concurrent-workers).
const workers = 5

func main() {
	kubeconfig := flag.String("kubeconfig", "", "path to a kubeconfig; empty means in-cluster config")
	clusterResourceNamespace := flag.String("cluster-resource-namespace", "cert-manager",
		"namespace holding the Secrets that ClusterIssuers refer to")
	// Only klog's -v is offered; klog logs to stderr by default.
	var klogFlags flag.FlagSet
	klog.InitFlags(&klogFlags)
	flag.Var(klogFlags.Lookup("v").Value, "v", "log verbosity (2 is info, 4 debug)")
	flag.Parse()

	logf.InitLogs()
	defer logf.FlushLogs()

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	ctx = logf.NewContext(ctx, logf.Log, "controller")

	if err := run(ctx, options(*kubeconfig, *clusterResourceNamespace)); err != nil {
		logf.Log.Error(err, "cert-manager controller failed")
		logf.FlushLogs()
		os.Exit(1)
	}
	logf.Log.Info("cert-manager controller stopped")
}

// options are the ContextOptions upstream's defaults would give, with
// namespace "" (watch all namespaces) and the given kubeconfig and cluster
// resource namespace.
func options(kubeconfig, clusterResourceNamespace string) controller.ContextOptions {
	return controller.ContextOptions{
		Kubeconfig:         kubeconfig,
		KubernetesAPIQPS:   20,
		KubernetesAPIBurst: 50,
		Namespace:          "",
		IssuerOptions: controller.IssuerOptions{
			ClusterResourceNamespace: clusterResourceNamespace,
		},
		CertificateOptions: controller.CertificateOptions{
			CopiedAnnotationPrefixes:                 []string{"*", "-kubectl.kubernetes.io/", "-fluxcd.io/", "-argocd.argoproj.io/"},
			CertificateRequestMinimumBackoffDuration: time.Hour,
			CertificateRequestMaximumBackoffDuration: 32 * time.Hour,
		},
	}
}

// run constructs the enabled controllers, starts the informers they asked
// for and runs them until ctx is done or one of them fails.
func run(ctx context.Context, opts controller.ContextOptions) error {
	log := logf.FromContext(ctx)
	factory, err := controller.NewContextFactory(ctx, opts)
	if err != nil {
		return err
	}
	// Every Context the factory builds shares the same informer factories;
	// this one is only used to start them.
	shared, err := factory.Build()
	if err != nil {
		return err
	}

	g, gctx := errgroup.WithContext(ctx)
	for _, name := range enabled {
		construct, ok := controller.Known()[name]
		if !ok {
			return fmt.Errorf("controller %q is not registered", name)
		}
		c, err := construct(factory)
		if err != nil {
			return fmt.Errorf("constructing controller %q: %w", name, err)
		}
		log.Info("starting controller", "controller", name)
		g.Go(func() error {
			if err := c.Run(workers, gctx); err != nil {
				return fmt.Errorf("controller %q: %w", name, err)
			}
			return nil
		})
	}

	// Informers are started after the controllers have registered theirs,
	// as upstream does; a factory starts only the informers asked of it.
	shared.KubeSharedInformerFactory.Start(gctx.Done())
	shared.SharedInformerFactory.Start(gctx.Done())
	shared.HTTP01ResourceMetadataInformersFactory.Start(gctx.Done())

	err = g.Wait()
	shared.KubeSharedInformerFactory.Shutdown()
	shared.SharedInformerFactory.Shutdown()
	shared.HTTP01ResourceMetadataInformersFactory.Shutdown()
	if ctx.Err() != nil {
		// Stopped by a signal: a controller still waiting for its caches
		// then reports that as an error, which is no failure.
		return nil
	}
	return err
}
