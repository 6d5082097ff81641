// Command cert-manager-lite runs, in one process, the parts of cert-manager that a self-signed CA chain and CA
// injection need: the Issuer controller, the Certificate controllers, the self-signed and CA CertificateRequest
// signers, the CertificateRequest approver, and the CA injector for (Mutating|Validating)WebhookConfigurations.
//
// Upstream's own mains (github.com/cert-manager/cert-manager/cmd/controller and cmd/cainjector) are separate Go
// modules that the module proxy does not serve; this wires the same packages of the root module together. It is a
// test stand-in for an installed cert-manager, not a replacement for it: no webhook (the CRDs' schemas validate), no
// ACME, Vault or Venafi issuers, no leader election, no metrics.
//
//	cert-manager-lite --kubeconfig FILE [--namespace NS] [--components controller,cainjector]
//
// --components runs a part alone (`controller` or `cainjector`), as upstream's two Deployments do, so that a test
// can stop the CA injector while the controller renews certificates.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	cmscheme "github.com/cert-manager/cert-manager/pkg/api"
	controllerpkg "github.com/cert-manager/cert-manager/pkg/controller"
	"github.com/cert-manager/cert-manager/pkg/controller/cainjector"

	// Each registers its controller (controllerpkg.Register) or issuer type (issuer.RegisterIssuer) in init.
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/approver"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/ca"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/selfsigned"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/issuing"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/keymanager"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/readiness"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/requestmanager"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/revisionmanager"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/trigger"
	_ "github.com/cert-manager/cert-manager/pkg/controller/issuers"
	_ "github.com/cert-manager/cert-manager/pkg/issuer/ca"
	_ "github.com/cert-manager/cert-manager/pkg/issuer/selfsigned"
)

// controllers are the registered control loops this process runs, by their upstream names.
var controllers = []string{
	"issuers",
	"certificates-trigger", "certificates-key-manager", "certificates-request-manager", "certificates-issuing",
	"certificates-readiness", "certificates-revision-manager",
	"certificaterequests-approver", "certificaterequests-issuer-selfsigned", "certificaterequests-issuer-ca",
}

func main() {
	// A flag set of its own: controller-runtime registers a global --kubeconfig flag in an init.
	flags := flag.NewFlagSet("cert-manager-lite", flag.ExitOnError)
	kubeconfig := flags.String("kubeconfig", "", "kubeconfig of the cluster (required)")
	namespace := flags.String("namespace", "", "only this namespace (default: all)")
	components := flags.String("components", "controller,cainjector",
		"the parts to run, comma-separated: controller (issuers, certificates, signers, approver), cainjector")
	klog.InitFlags(flags)
	_ = flags.Parse(os.Args[1:])
	if *kubeconfig == "" {
		fmt.Fprintln(os.Stderr, "cert-manager-lite: --kubeconfig is required")
		os.Exit(2)
	}
	parts := map[string]bool{}
	for _, part := range strings.Split(*components, ",") {
		if part != "controller" && part != "cainjector" {
			fmt.Fprintf(os.Stderr, "cert-manager-lite: --components=%s: %q is not a part; use controller, cainjector or both\n",
				*components, part)
			os.Exit(2)
		}
		parts[part] = true
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctrl.SetLogger(klog.NewKlogr())
	if err := run(ctx, *kubeconfig, *namespace, parts["controller"], parts["cainjector"]); err != nil {
		fmt.Fprintf(os.Stderr, "cert-manager-lite: %v\n", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, kubeconfig, namespace string, withController, withInjector bool) error {
	errs := make(chan error, len(controllers)+1)
	var wg sync.WaitGroup
	if withController {
		if err := startController(ctx, kubeconfig, namespace, errs, &wg); err != nil {
			return err
		}
	}
	if withInjector {
		injector, err := newInjector(ctx, kubeconfig, namespace)
		if err != nil {
			return err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := injector.Start(ctx); err != nil {
				errs <- fmt.Errorf("cainjector: %w", err)
			}
		}()
	}
	fmt.Fprintf(os.Stderr, "cert-manager-lite: running (controller %t, cainjector %t)\n", withController, withInjector)
	select {
	case err := <-errs:
		return err
	case <-ctx.Done():
		wg.Wait()
		return nil
	}
}

// startController starts the Issuer, Certificate and CertificateRequest controllers; an error of one reaches errs.
func startController(ctx context.Context, kubeconfig, namespace string, errs chan<- error, wg *sync.WaitGroup) error {
	factory, err := controllerpkg.NewContextFactory(ctx, controllerpkg.ContextOptions{
		Kubeconfig: kubeconfig, Namespace: namespace, KubernetesAPIQPS: 50, KubernetesAPIBurst: 100,
		IssuerOptions: controllerpkg.IssuerOptions{ClusterResourceNamespace: "kube-system"},
		CertificateOptions: controllerpkg.CertificateOptions{
			CertificateRequestMinimumBackoffDuration: 5 * time.Second,
			CertificateRequestMaximumBackoffDuration: time.Minute,
		},
	})
	if err != nil {
		return fmt.Errorf("controller context: %w", err)
	}
	var loops []controllerpkg.Interface
	for _, name := range controllers {
		construct, ok := controllerpkg.Known()[name]
		if !ok {
			return fmt.Errorf("no controller %q is registered", name)
		}
		loop, err := construct(factory)
		if err != nil {
			return fmt.Errorf("controller %s: %w", name, err)
		}
		loops = append(loops, loop)
	}
	// The controllers asked the shared informer factories for their informers; start them all.
	shared, err := factory.Build()
	if err != nil {
		return err
	}
	shared.KubeSharedInformerFactory.Start(ctx.Done())
	shared.SharedInformerFactory.Start(ctx.Done())
	shared.HTTP01ResourceMetadataInformersFactory.Start(ctx.Done())

	for i, loop := range loops {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := loop.Run(2, ctx); err != nil {
				errs <- fmt.Errorf("controller %s: %w", controllers[i], err)
			}
		}()
	}
	return nil
}

// newInjector is cainjector: a controller-runtime manager whose reconcilers copy the CA of the Certificate named
// by cert-manager.io/inject-ca-from into the caBundle of every webhook configuration that carries it.
func newInjector(ctx context.Context, kubeconfig, namespace string) (ctrl.Manager, error) {
	config, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("kubeconfig %s: %w", kubeconfig, err)
	}
	config.UserAgent = "cert-manager-cainjector"
	scheme := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(cmscheme.AddToScheme(scheme))
	utilruntime.Must(apiextv1.AddToScheme(scheme))
	utilruntime.Must(admissionv1.AddToScheme(scheme))
	mgr, err := ctrl.NewManager(config, ctrl.Options{
		Scheme:                 scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		LeaderElection:         false,
		// As upstream's cainjector: Secrets are watched by metadata only and read from the API server.
		Client: client.Options{Cache: &client.CacheOptions{DisableFor: []client.Object{&corev1.Secret{}}}},
	})
	if err != nil {
		return nil, fmt.Errorf("cainjector manager: %w", err)
	}
	if err := cainjector.RegisterAllInjectors(ctx, mgr, cainjector.SetupOptions{
		Namespace:                    namespace,
		EnableCertificatesDataSource: true,
		EnabledReconcilersFor: map[string]bool{
			"mutatingwebhookconfiguration": true, "validatingwebhookconfiguration": true,
		},
	}); err != nil {
		return nil, fmt.Errorf("cainjector: %w", err)
	}
	return mgr, nil
}
