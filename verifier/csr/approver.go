package csr

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strings"
	"time"

	certv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	bootstrapapi "k8s.io/cluster-bootstrap/token/api"

	"github.com/latchkey/latchkey/internal/logkey"
	"github.com/latchkey/latchkey/verifier/token"
)

// Reasons the approver writes into CSR conditions and events.
const (
	ReasonApproved = "LatchkeyAttestedNode"
	ReasonDenied   = "LatchkeyNodeMismatch"

	nodeUserPrefix = "system:node:"
	nodesGroup     = "system:nodes"
	maxCSRBytes    = 64 << 10
)

// NodeTokens tells the approver which bootstrap token the node's binding
// record names (verifier/binding's node record: the last token minted for
// the machine the name is bound to).
type NodeTokens interface {
	// NodeTokenID returns the token ID recorded for node, "" when none;
	// an error when the record cannot be read (the CSR is then retried).
	NodeTokenID(ctx context.Context, node string) (string, error)
}

// ApproverConfig configures the CSR approver.
type ApproverConfig struct {
	Client kubernetes.Interface
	// Tokens names the token bound to each node name (required).
	Tokens NodeTokens
	Logger *slog.Logger
	// ServingCertificates also approves kubelet-serving CSRs (which
	// upstream never approves) of nodes that authenticate as the node the
	// certificate names and whose addresses the Node object lists. Off by
	// default.
	ServingCertificates bool
	// Resync re-examines pending CSRs, retrying failed updates (default
	// 30s); with Informers, that factory's resync period applies instead.
	Resync time.Duration
	// Informers, when set, is the informer factory the approver shares
	// with the verifier's other controllers (its owner starts nothing
	// twice and shuts it down); nil makes one of its own.
	Informers informers.SharedInformerFactory
	// Workers is how many CSRs are decided at once (DefaultWorkers when
	// zero).
	Workers int
}

// Approver approves the kubelet client CSR of a node joining with a
// latchkey token only when it asks for exactly the node name that was
// attested for that token, and that name's binding record names that
// very token; it denies, with an event saying why, any other client CSR
// made with a latchkey token. CSRs made by anyone else are left alone.
//
// The attested name reaches the approver in the CSR itself: the token's
// per-node extra group (NodeGroup) is copied by the API server into the
// CSR's spec.groups, which the requester cannot forge. The binding check
// adds that the name is bound to the machine the token was minted for:
// the requester is system:bootstrap:<token ID>, and that ID must be the
// one the node's binding record holds, so even a token carrying another
// node's group (leaked, or minted before the name was rebound) cannot get
// system:node:<that name>.
type Approver struct {
	cfg ApproverConfig
	log *slog.Logger
}

// Verdict is what the approver decided about one CSR.
type Verdict int

// Verdicts.
const (
	Ignore Verdict = iota
	Approve
	Deny
)

func (v Verdict) String() string { return [...]string{"ignore", "approve", "deny"}[v] }

// NewApprover checks cfg.
func NewApprover(cfg ApproverConfig) (*Approver, error) {
	if cfg.Client == nil {
		return nil, errors.New("approver: no Kubernetes client")
	}
	if cfg.Tokens == nil {
		return nil, errors.New("approver: no node binding records")
	}
	cfg.Resync = resync(cfg.Resync)
	return &Approver{cfg: cfg, log: componentLog(cfg.Logger, "csr-approver")}, nil
}

// resync is a controller's resync period: d, or 30s by default.
func resync(d time.Duration) time.Duration {
	if d <= 0 {
		return 30 * time.Second
	}
	return d
}

// componentLog is log (slog.Default() when nil) naming the controller.
func componentLog(log *slog.Logger, component string) *slog.Logger {
	if log == nil {
		log = slog.Default()
	}
	return log.With(logkey.Component, component)
}

// Run watches CSRs until ctx ends.
func (a *Approver) Run(ctx context.Context) error {
	f, done := informerFactory(a.cfg.Informers, a.cfg.Client, a.cfg.Resync)
	inf := f.Certificates().V1().CertificateSigningRequests().Informer()
	f.Start(ctx.Done())
	defer done()
	go logSynced(ctx, a.log, inf.HasSynced)
	err := runQueued(ctx, inf, a.cfg.Workers, func(ctx context.Context, obj any) {
		if csr, ok := obj.(*certv1.CertificateSigningRequest); ok {
			a.Handle(ctx, csr)
		}
	})
	if err != nil {
		return fmt.Errorf("approver: %w", err)
	}
	return nil
}

// Handle decides one CSR and writes the decision.
func (a *Approver) Handle(ctx context.Context, csr *certv1.CertificateSigningRequest) {
	v, why := a.Decide(ctx, csr)
	if v == Ignore {
		return
	}
	if err := a.write(ctx, csr, v, why); err != nil {
		if !apierrors.IsConflict(err) && !apierrors.IsNotFound(err) {
			a.log.Error("could not record CSR decision", logkey.CSR, csr.Name, logkey.Verdict, v.String(), logkey.Error, err)
		}
		return
	}
	a.log.Info("CSR decided", logkey.CSR, csr.Name, logkey.Signer, csr.Spec.SignerName,
		logkey.Requester, csr.Spec.Username, logkey.Verdict, v.String(), logkey.Why, why)
}

// Decide returns the verdict on csr and why.
func (a *Approver) Decide(ctx context.Context, csr *certv1.CertificateSigningRequest) (Verdict, string) {
	if decided(csr) {
		return Ignore, "already decided"
	}
	switch csr.Spec.SignerName {
	case certv1.KubeAPIServerClientKubeletSignerName:
		return a.decideClient(ctx, csr)
	case certv1.KubeletServingSignerName:
		if a.cfg.ServingCertificates {
			return a.decideServing(ctx, csr)
		}
	}
	return Ignore, "not a latchkey CSR"
}

func decided(csr *certv1.CertificateSigningRequest) bool {
	for _, c := range csr.Status.Conditions {
		if c.Type == certv1.CertificateApproved || c.Type == certv1.CertificateDenied || c.Type == certv1.CertificateFailed {
			return true
		}
	}
	return false
}

// decideClient rules on a kubelet client CSR.
func (a *Approver) decideClient(ctx context.Context, csr *certv1.CertificateSigningRequest) (Verdict, string) {
	if !strings.HasPrefix(csr.Spec.Username, bootstrapapi.BootstrapUserPrefix) || !slices.Contains(csr.Spec.Groups, token.Group) {
		return Ignore, "not made with a latchkey token"
	}
	req, err := parseCSR(csr.Spec.Request)
	if err != nil {
		return Deny, err.Error()
	}
	node, ok := strings.CutPrefix(req.Subject.CommonName, nodeUserPrefix)
	if !ok || node == "" {
		return Deny, fmt.Sprintf("subject %q is not system:node:<name>", req.Subject.CommonName)
	}
	if !slices.Contains(csr.Spec.Groups, token.NodeGroup(node)) {
		return Deny, fmt.Sprintf("asks for node %q, but the token was minted for another attested node", node)
	}
	if !slices.Equal(req.Subject.Organization, []string{nodesGroup}) {
		return Deny, fmt.Sprintf("organization %q is not [system:nodes]", req.Subject.Organization)
	}
	if hasSANs(req) {
		return Deny, "a kubelet client certificate carries no subject alternative names"
	}
	if !usagesOK(csr.Spec.Usages, certv1.UsageClientAuth) {
		return Deny, fmt.Sprintf("usages %v are not a kubelet client's", csr.Spec.Usages)
	}
	id := strings.TrimPrefix(csr.Spec.Username, bootstrapapi.BootstrapUserPrefix)
	bound, err := a.cfg.Tokens.NodeTokenID(ctx, node)
	if err != nil {
		return Ignore, fmt.Sprintf("binding record of node %q not readable yet: %v", node, err)
	}
	if bound == "" {
		return Deny, fmt.Sprintf("node %q has no binding record naming a token", node)
	}
	if bound != id {
		return Deny, fmt.Sprintf("node %q is bound to a machine that was given another token than %s", node, id)
	}
	return Approve, fmt.Sprintf("node %q was attested for token %s, the token its binding records", node, id)
}

// decideServing rules on a kubelet serving CSR: the requester must be
// the node the certificate names, and every SAN one of its addresses.
func (a *Approver) decideServing(ctx context.Context, csr *certv1.CertificateSigningRequest) (Verdict, string) {
	node, ok := strings.CutPrefix(csr.Spec.Username, nodeUserPrefix)
	if !ok || !slices.Contains(csr.Spec.Groups, nodesGroup) {
		return Ignore, "not requested by a node"
	}
	req, err := parseCSR(csr.Spec.Request)
	if err != nil {
		return Deny, err.Error()
	}
	if req.Subject.CommonName != csr.Spec.Username || !slices.Equal(req.Subject.Organization, []string{nodesGroup}) {
		return Deny, fmt.Sprintf("node %q asks for subject %q %q", node, req.Subject.CommonName, req.Subject.Organization)
	}
	if len(req.EmailAddresses) > 0 || len(req.URIs) > 0 || len(req.DNSNames)+len(req.IPAddresses) == 0 {
		return Deny, "a kubelet serving certificate names DNS names and IP addresses only"
	}
	if !usagesOK(csr.Spec.Usages, certv1.UsageServerAuth) {
		return Deny, fmt.Sprintf("usages %v are not a kubelet server's", csr.Spec.Usages)
	}
	n, err := a.cfg.Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		return Ignore, fmt.Sprintf("node %q not readable yet: %v", node, err)
	}
	if bad := foreignSANs(req, n); bad != "" {
		return Deny, fmt.Sprintf("node %q does not have address %s", node, bad)
	}
	return Approve, fmt.Sprintf("serving certificate of node %q for its own addresses", node)
}

func parseCSR(raw []byte) (*x509.CertificateRequest, error) {
	if len(raw) > maxCSRBytes {
		return nil, errors.New("request too large")
	}
	b, _ := pem.Decode(raw)
	if b == nil || b.Type != "CERTIFICATE REQUEST" {
		return nil, errors.New("request is not a PEM certificate request")
	}
	req, err := x509.ParseCertificateRequest(b.Bytes)
	if err != nil {
		return nil, fmt.Errorf("parse request: %w", err)
	}
	return req, req.CheckSignature()
}

func hasSANs(r *x509.CertificateRequest) bool {
	return len(r.DNSNames)+len(r.IPAddresses)+len(r.EmailAddresses)+len(r.URIs) > 0
}

// usagesOK accepts exactly {digital signature, auth} with optional key
// encipherment, as the kubelet asks.
func usagesOK(us []certv1.KeyUsage, auth certv1.KeyUsage) bool {
	rest := slices.DeleteFunc(slices.Clone(us), func(u certv1.KeyUsage) bool { return u == certv1.UsageKeyEncipherment })
	slices.Sort(rest)
	want := []certv1.KeyUsage{certv1.UsageDigitalSignature, auth}
	slices.Sort(want)
	return slices.Equal(slices.Compact(rest), want)
}

// foreignSANs returns the first SAN the Node does not list, or "".
func foreignSANs(r *x509.CertificateRequest, n *corev1.Node) string {
	have := map[string]bool{}
	for _, a := range n.Status.Addresses {
		if ip := net.ParseIP(a.Address); ip != nil {
			have[ip.String()] = true
		} else {
			have[strings.ToLower(a.Address)] = true
		}
	}
	for _, d := range r.DNSNames {
		if !have[strings.ToLower(d)] {
			return d
		}
	}
	for _, ip := range r.IPAddresses {
		if !have[ip.String()] {
			return ip.String()
		}
	}
	return ""
}

// write records the verdict as a CSR condition, and a denial also as a
// Warning event. An approval posts no event: its condition already says
// why (the kube-controller-manager's approver posts none either), and an
// event would be one more API write, and etcd write, per join.
func (a *Approver) write(ctx context.Context, csr *certv1.CertificateSigningRequest, v Verdict, why string) error {
	c := csr.DeepCopy()
	cond := certv1.CertificateSigningRequestCondition{
		Type: certv1.CertificateApproved, Status: corev1.ConditionTrue,
		Reason: ReasonApproved, Message: "latchkey: " + why, LastUpdateTime: metav1.Now(),
	}
	if v == Deny {
		cond.Type, cond.Reason = certv1.CertificateDenied, ReasonDenied
	}
	c.Status.Conditions = append(c.Status.Conditions, cond)
	if _, err := a.cfg.Client.CertificatesV1().CertificateSigningRequests().UpdateApproval(ctx, c.Name, c, metav1.UpdateOptions{}); err != nil {
		return err
	}
	if v == Deny {
		a.warn(ctx, csr, cond.Reason, cond.Message)
	}
	return nil
}

// warn records a Warning event on the (cluster-scoped) CSR in the
// default namespace; failing to record it is logged only.
func (a *Approver) warn(ctx context.Context, csr *certv1.CertificateSigningRequest, reason, msg string) {
	now := metav1.Now()
	ev := &corev1.Event{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s.%x", csr.Name, now.UnixNano()), Namespace: metav1.NamespaceDefault},
		InvolvedObject: corev1.ObjectReference{
			Kind: "CertificateSigningRequest", APIVersion: certv1.SchemeGroupVersion.String(),
			Name: csr.Name, UID: csr.UID,
		},
		Type: corev1.EventTypeWarning, Reason: reason, Message: msg,
		Source:         corev1.EventSource{Component: "latchkey-verifier"},
		FirstTimestamp: now, LastTimestamp: now, Count: 1,
	}
	if _, err := a.cfg.Client.CoreV1().Events(metav1.NamespaceDefault).Create(ctx, ev, metav1.CreateOptions{}); err != nil {
		a.log.Warn("could not record CSR event", logkey.CSR, csr.Name, logkey.Error, err)
	}
}
