// Command k8scheck is the measured e2e's host-side view of the cluster
// (scripts/vm/phase2.sh, LATCHKEY_E2E_JOIN=kubeadm): typed assertions,
// made with the control plane's admin credential through client-go, about
// the node a real kubelet in the QEMU guest joined as. Each subcommand
// prints what it found on one line and exits 0 when the assertion holds,
// 1 when it does not (with the reason on stderr), 2 on bad usage.
//
//	k8scheck -kubeconfig F node-ready   -node N [-since RFC3339] [-timeout D]
//	k8scheck -kubeconfig F node-absent  -node N
//	k8scheck -kubeconfig F node-delete  -node N
//	k8scheck -kubeconfig F client-cert  -node N -cert PEM
//	k8scheck -kubeconfig F csr-approved -node N [-since T] [-cert PEM] [-timeout D]
//	k8scheck -kubeconfig F csr-denied   -node N [-since T] [-timeout D]
//	k8scheck -kubeconfig F token-gone   -id ID [-timeout D]
//	k8scheck -kubeconfig F untainted    -node N [-timeout D]
//	k8scheck -kubeconfig F cordoned     -node N [-timeout D]
//	k8scheck -kubeconfig F uncordoned   -node N [-timeout D]
//
// It is a test tool: it is built and run by the harness only and is no
// part of latchkey's binaries.
package main

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	certv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	bootstrapapi "k8s.io/cluster-bootstrap/token/api"

	"github.com/latchkey/latchkey/internal/kubekey"
	"github.com/latchkey/latchkey/verifier/csr"
)

// poll is how often a waiting check asks the API server again.
const poll = time.Second

func main() {
	os.Exit(run(os.Args[1:]))
}

type opts struct {
	node, cert, id string
	since          time.Time
	timeout        time.Duration
}

func run(args []string) int {
	top := flag.NewFlagSet("k8scheck", flag.ContinueOnError)
	kubeconfig := top.String("kubeconfig", "", "admin kubeconfig (required)")
	if err := top.Parse(args); err != nil || top.NArg() < 1 || *kubeconfig == "" {
		fmt.Fprintln(os.Stderr, "usage: k8scheck -kubeconfig FILE SUBCOMMAND [flags]")
		return 2
	}
	sub := top.Arg(0)
	fs := flag.NewFlagSet(sub, flag.ContinueOnError)
	var o opts
	var since string
	fs.StringVar(&o.node, "node", "", "node name")
	fs.StringVar(&o.cert, "cert", "", "PEM file with the kubelet's client certificate")
	fs.StringVar(&o.id, "id", "", "bootstrap token ID")
	fs.StringVar(&since, "since", "", "RFC 3339 time the Ready heartbeat (or a CSR) must not be older than")
	fs.DurationVar(&o.timeout, "timeout", 0, "how long to wait for the state (0: look once)")
	if err := fs.Parse(top.Args()[1:]); err != nil {
		return 2
	}
	if since != "" {
		t, err := time.Parse(time.RFC3339, since)
		if err != nil {
			fmt.Fprintf(os.Stderr, "k8scheck: -since: %v\n", err)
			return 2
		}
		o.since = t
	}
	rc, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		fmt.Fprintf(os.Stderr, "k8scheck: %v\n", err)
		return 2
	}
	rc.UserAgent = "latchkey-e2e-k8scheck"
	c, err := kubernetes.NewForConfig(rc)
	if err != nil {
		fmt.Fprintf(os.Stderr, "k8scheck: %v\n", err)
		return 2
	}
	checks := map[string]func(context.Context, kubernetes.Interface, *rest.Config, opts) (string, error){
		"node-ready": nodeReady, "node-absent": nodeAbsent, "node-delete": nodeDelete,
		"client-cert": clientCert, "csr-approved": csrApproved, "csr-denied": csrDenied, "token-gone": tokenGone,
		"untainted": untainted, "cordoned": cordoned, "uncordoned": uncordoned,
	}
	f, ok := checks[sub]
	if !ok {
		fmt.Fprintf(os.Stderr, "k8scheck: unknown subcommand %q\n", sub)
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), o.timeout+30*time.Second)
	defer cancel()
	out, err := f(ctx, c, rc, o)
	if err != nil {
		fmt.Fprintf(os.Stderr, "k8scheck %s: %v\n", sub, err)
		return 1
	}
	fmt.Printf("k8scheck %s: %s\n", sub, out)
	return 0
}

// wait calls try until it reports done, its error is final, or timeout
// passes (then the last reason why not is the error).
func wait(ctx context.Context, timeout time.Duration, try func() (string, bool, error)) (string, error) {
	deadline := time.Now().Add(timeout)
	for {
		out, done, err := try()
		if err != nil {
			return "", err
		}
		if done {
			return out, nil
		}
		if !time.Now().Before(deadline) {
			return "", fmt.Errorf("after %s: %s", timeout, out)
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(poll):
		}
	}
}

// transient tells API errors worth another poll from final ones.
func transient(err error) bool {
	return apierrors.IsServerTimeout(err) || apierrors.IsTimeout(err) || apierrors.IsTooManyRequests(err) ||
		apierrors.IsServiceUnavailable(err) || errors.Is(err, context.DeadlineExceeded)
}

// nodeReady: the Node exists and its Ready condition is True, with a
// heartbeat no older than -since (so a status left by an earlier boot
// does not count).
func nodeReady(ctx context.Context, c kubernetes.Interface, _ *rest.Config, o opts) (string, error) {
	if o.node == "" {
		return "", errors.New("-node is required")
	}
	return wait(ctx, o.timeout, func() (string, bool, error) {
		n, err := c.CoreV1().Nodes().Get(ctx, o.node, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return fmt.Sprintf("node %s not registered", o.node), false, nil
		}
		if err != nil {
			return err.Error(), false, nil
		}
		for _, cond := range n.Status.Conditions {
			if cond.Type != corev1.NodeReady {
				continue
			}
			state := fmt.Sprintf("node %s Ready=%s reason=%s heartbeat=%s kubelet=%s runtime=%s", o.node, cond.Status,
				cond.Reason, cond.LastHeartbeatTime.UTC().Format(time.RFC3339), n.Status.NodeInfo.KubeletVersion,
				n.Status.NodeInfo.ContainerRuntimeVersion)
			fresh := o.since.IsZero() || !cond.LastHeartbeatTime.Time.Before(o.since)
			return state, cond.Status == corev1.ConditionTrue && fresh, nil
		}
		return fmt.Sprintf("node %s has no Ready condition yet", o.node), false, nil
	})
}

// nodeAbsent: no Node of that name.
func nodeAbsent(ctx context.Context, c kubernetes.Interface, _ *rest.Config, o opts) (string, error) {
	n, err := c.CoreV1().Nodes().Get(ctx, o.node, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return fmt.Sprintf("no node %s", o.node), nil
	}
	if err != nil {
		return "", err
	}
	return "", fmt.Errorf("node %s exists (created %s)", o.node, n.CreationTimestamp.UTC().Format(time.RFC3339))
}

// nodeDelete: the operator's half of replacing a machine (with
// `latchkey-verifier bindings release`): the old Node object goes.
func nodeDelete(ctx context.Context, c kubernetes.Interface, _ *rest.Config, o opts) (string, error) {
	err := c.CoreV1().Nodes().Delete(ctx, o.node, metav1.DeleteOptions{})
	if apierrors.IsNotFound(err) {
		return fmt.Sprintf("no node %s to delete", o.node), nil
	}
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("node %s deleted", o.node), nil
}

// clientCert: the kubelet's client certificate is a client certificate
// for system:node:<node> in system:nodes, issued by the cluster CA (the
// admin kubeconfig's CA, which the controller-manager signs with) and
// valid now.
func clientCert(_ context.Context, _ kubernetes.Interface, rc *rest.Config, o opts) (string, error) {
	b, err := os.ReadFile(o.cert)
	if err != nil {
		return "", err
	}
	blk, _ := pem.Decode(b)
	if blk == nil || blk.Type != "CERTIFICATE" {
		return "", fmt.Errorf("%s holds no PEM certificate", o.cert)
	}
	cert, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		return "", err
	}
	if err := wantNodeSubject(cert, o.node); err != nil {
		return "", err
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(rc.CAData) {
		return "", errors.New("the kubeconfig carries no CA data")
	}
	if _, err := cert.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		return "", fmt.Errorf("not a client certificate of the cluster CA: %w", err)
	}
	return fmt.Sprintf("CN=%s O=%s issuer=%q serial=%s notAfter=%s", cert.Subject.CommonName,
		strings.Join(cert.Subject.Organization, ","), cert.Issuer.CommonName, cert.SerialNumber,
		cert.NotAfter.UTC().Format(time.RFC3339)), nil
}

func wantNodeSubject(cert *x509.Certificate, node string) error {
	if want := "system:node:" + node; cert.Subject.CommonName != want {
		return fmt.Errorf("certificate CN %q, want %q", cert.Subject.CommonName, want)
	}
	if !slices.Equal(cert.Subject.Organization, []string{"system:nodes"}) {
		return fmt.Errorf("certificate O %q, want [system:nodes]", cert.Subject.Organization)
	}
	return nil
}

// kubeletCSRs are the kubelet client CSRs whose request names node,
// made at since or later.
func kubeletCSRs(ctx context.Context, c kubernetes.Interface, node string, since time.Time) ([]certv1.CertificateSigningRequest, error) {
	l, err := c.CertificatesV1().CertificateSigningRequests().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	var out []certv1.CertificateSigningRequest
	for _, r := range l.Items {
		if r.Spec.SignerName != certv1.KubeAPIServerClientKubeletSignerName || r.CreationTimestamp.Time.Before(since) {
			continue
		}
		blk, _ := pem.Decode(r.Spec.Request)
		if blk == nil {
			continue
		}
		req, err := x509.ParseCertificateRequest(blk.Bytes)
		if err == nil && req.Subject.CommonName == "system:node:"+node {
			out = append(out, r)
		}
	}
	return out, nil
}

func condition(r certv1.CertificateSigningRequest, t certv1.RequestConditionType) *certv1.CertificateSigningRequestCondition {
	for i := range r.Status.Conditions {
		if r.Status.Conditions[i].Type == t {
			return &r.Status.Conditions[i]
		}
	}
	return nil
}

// csrApproved: a bootstrap-token CSR for system:node:<node> (made since
// -since) was approved by latchkey's approver (reason csr.ReasonApproved)
// and signed, and the issued certificate names the node and, with -cert,
// is the very certificate the kubelet holds. No such CSR was denied.
func csrApproved(ctx context.Context, c kubernetes.Interface, _ *rest.Config, o opts) (string, error) {
	var held []byte
	if o.cert != "" {
		b, err := os.ReadFile(o.cert)
		if err != nil {
			return "", err
		}
		blk, _ := pem.Decode(b)
		if blk == nil {
			return "", fmt.Errorf("%s holds no PEM certificate", o.cert)
		}
		held = blk.Bytes
	}
	return wait(ctx, o.timeout, func() (string, bool, error) {
		rs, err := kubeletCSRs(ctx, c, o.node, o.since)
		if err != nil {
			return err.Error(), false, nil
		}
		for _, r := range rs {
			if d := condition(r, certv1.CertificateDenied); d != nil {
				return "", false, fmt.Errorf("csr %s for %s was denied: %s: %s", r.Name, o.node, d.Reason, d.Message)
			}
		}
		for _, r := range rs {
			a := condition(r, certv1.CertificateApproved)
			if a == nil || !strings.HasPrefix(r.Spec.Username, bootstrapapi.BootstrapUserPrefix) {
				continue
			}
			if a.Reason != csr.ReasonApproved {
				return "", false, fmt.Errorf("csr %s approved with reason %q, not latchkey's %q", r.Name, a.Reason, csr.ReasonApproved)
			}
			if len(r.Status.Certificate) == 0 {
				return fmt.Sprintf("csr %s approved, not signed yet", r.Name), false, nil
			}
			blk, _ := pem.Decode(r.Status.Certificate)
			if blk == nil {
				return "", false, fmt.Errorf("csr %s: issued certificate is not PEM", r.Name)
			}
			cert, err := x509.ParseCertificate(blk.Bytes)
			if err != nil {
				return "", false, fmt.Errorf("csr %s: %w", r.Name, err)
			}
			if err := wantNodeSubject(cert, o.node); err != nil {
				return "", false, fmt.Errorf("csr %s: %w", r.Name, err)
			}
			if held != nil && !bytes.Equal(held, cert.Raw) {
				return "", false, fmt.Errorf("csr %s issued serial %s, but the kubelet holds another certificate", r.Name, cert.SerialNumber)
			}
			return fmt.Sprintf("csr %s by %s approved (%s: %s), issued CN=%s O=%s", r.Name, r.Spec.Username,
				a.Reason, a.Message, cert.Subject.CommonName, strings.Join(cert.Subject.Organization, ",")), true, nil
		}
		return fmt.Sprintf("%d kubelet CSR(s) for %s, none approved", len(rs), o.node), false, nil
	})
}

// csrDenied: a CSR for system:node:<node> made with a bootstrap token was
// denied by latchkey's approver (reason csr.ReasonDenied, the message
// saying the token was minted for another node), and no certificate was
// issued for the node.
func csrDenied(ctx context.Context, c kubernetes.Interface, _ *rest.Config, o opts) (string, error) {
	const why = "but the token was minted for another attested node"
	return wait(ctx, o.timeout, func() (string, bool, error) {
		rs, err := kubeletCSRs(ctx, c, o.node, o.since)
		if err != nil {
			return err.Error(), false, nil
		}
		for _, r := range rs {
			if a := condition(r, certv1.CertificateApproved); a != nil || len(r.Status.Certificate) > 0 {
				return "", false, fmt.Errorf("csr %s for %s was approved (%v)", r.Name, o.node, a)
			}
		}
		for _, r := range rs {
			d := condition(r, certv1.CertificateDenied)
			if d == nil {
				continue
			}
			want := fmt.Sprintf("latchkey: asks for node %q, %s", o.node, why)
			if d.Reason != csr.ReasonDenied || d.Message != want {
				return "", false, fmt.Errorf("csr %s denied with %s: %q, want %s: %q", r.Name, d.Reason, d.Message, csr.ReasonDenied, want)
			}
			return fmt.Sprintf("csr %s by %s denied (%s: %s)", r.Name, r.Spec.Username, d.Reason, d.Message), true, nil
		}
		return fmt.Sprintf("%d kubelet CSR(s) for %s, none denied yet", len(rs), o.node), false, nil
	})
}

// tokenGone: the bootstrap token's Secret is deleted.
func tokenGone(ctx context.Context, c kubernetes.Interface, _ *rest.Config, o opts) (string, error) {
	if o.id == "" {
		return "", errors.New("-id is required")
	}
	name := bootstrapapi.BootstrapTokenSecretPrefix + o.id
	return wait(ctx, o.timeout, func() (string, bool, error) {
		s, err := c.CoreV1().Secrets(metav1.NamespaceSystem).Get(ctx, name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			return fmt.Sprintf("secret kube-system/%s deleted", name), true, nil
		case err != nil && transient(err):
			return err.Error(), false, nil
		case err != nil:
			return "", false, err
		}
		return fmt.Sprintf("secret kube-system/%s still there (created %s)", name, s.CreationTimestamp.UTC().Format(time.RFC3339)), false, nil
	})
}

// untainted: the Node exists and carries no latchkey.io/unattested taint
// (whatever its value: offline, refused or stale), i.e. the verifier's
// taint controller counts it attested.
func untainted(ctx context.Context, c kubernetes.Interface, _ *rest.Config, o opts) (string, error) {
	return nodeState(ctx, c, o, func(n *corev1.Node) (string, bool) {
		for _, t := range n.Spec.Taints {
			if t.Key == kubekey.TaintUnattested {
				return fmt.Sprintf("node %s has taint %s=%s:%s", n.Name, t.Key, t.Value, t.Effect), false
			}
		}
		return fmt.Sprintf("node %s has no %s taint (%d taint(s))", n.Name, kubekey.TaintUnattested, len(n.Spec.Taints)), true
	})
}

// cordoned: the Node is unschedulable with latchkey's offline-cordon
// annotation (and its time): the agent cordoned it after an offline
// unlock, with the kubelet's credentials.
func cordoned(ctx context.Context, c kubernetes.Interface, _ *rest.Config, o opts) (string, error) {
	return nodeState(ctx, c, o, func(n *corev1.Node) (string, bool) {
		v, at := n.Annotations[kubekey.AnnotationCordoned], n.Annotations[kubekey.AnnotationCordonedAt]
		if !n.Spec.Unschedulable || v != "offline" || at == "" {
			return fmt.Sprintf("node %s unschedulable=%v %s=%q %s=%q", n.Name, n.Spec.Unschedulable, kubekey.AnnotationCordoned, v, kubekey.AnnotationCordonedAt, at), false
		}
		return fmt.Sprintf("node %s cordoned by latchkey offline at %s", n.Name, at), true
	})
}

// uncordoned: the Node is schedulable and carries neither of latchkey's
// cordon annotations: the verifier lifted the cordon.
func uncordoned(ctx context.Context, c kubernetes.Interface, _ *rest.Config, o opts) (string, error) {
	return nodeState(ctx, c, o, func(n *corev1.Node) (string, bool) {
		_, has := n.Annotations[kubekey.AnnotationCordoned]
		_, hasAt := n.Annotations[kubekey.AnnotationCordonedAt]
		if n.Spec.Unschedulable || has || hasAt {
			return fmt.Sprintf("node %s unschedulable=%v, latchkey cordon annotations: %v %v", n.Name, n.Spec.Unschedulable, has, hasAt), false
		}
		return fmt.Sprintf("node %s schedulable, no latchkey cordon annotation", n.Name), true
	})
}

// nodeState waits until ok holds for the Node.
func nodeState(ctx context.Context, c kubernetes.Interface, o opts, ok func(*corev1.Node) (string, bool)) (string, error) {
	if o.node == "" {
		return "", errors.New("-node is required")
	}
	return wait(ctx, o.timeout, func() (string, bool, error) {
		n, err := c.CoreV1().Nodes().Get(ctx, o.node, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return "", false, fmt.Errorf("no node %s", o.node)
		}
		if err != nil {
			return err.Error(), false, nil
		}
		out, done := ok(n)
		return out, done, nil
	})
}
