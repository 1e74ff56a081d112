// Command apply-rbac installs latchkey's RBAC (verifier/deploy) into the
// cluster a kubeconfig names, for clusters without kubectl at hand.
//
//	go run ./verifier/deploy/apply-rbac --kubeconfig /etc/kubernetes/super-admin.conf
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/latchkey/latchkey/verifier/deploy"
)

func main() {
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig of a cluster administrator")
	flag.Parse()
	if err := run(*kubeconfig); err != nil {
		fmt.Fprintln(os.Stderr, "apply-rbac:", err)
		os.Exit(1)
	}
}

func run(kubeconfig string) error {
	if kubeconfig == "" {
		return fmt.Errorf("--kubeconfig is required")
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return err
	}
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := deploy.Apply(ctx, c); err != nil {
		return err
	}
	fmt.Println("latchkey RBAC applied")
	return nil
}
