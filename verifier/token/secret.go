package token

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	bootstrapapi "k8s.io/cluster-bootstrap/token/api"

	"github.com/latchkey/latchkey/internal/kubekey"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
	"github.com/latchkey/latchkey/protocol"
)

// Groups and labels latchkey's bootstrap tokens carry. The shipped RBAC
// (verifier/deploy) binds Group to what `kubeadm join` needs and
// ControlPlaneGroup to reading the kubeadm-certs Secret; neither is bound
// to kubeadm's CSR auto-approval, so only the verifier's approver signs off
// a latchkey node's client certificate.
const (
	// Group is the extra group of every latchkey bootstrap token.
	Group = "system:bootstrappers:latchkey"
	// ControlPlaneGroup is added for control-plane tokens only.
	ControlPlaneGroup = "system:bootstrappers:latchkey:control-plane"
	// NodeGroupPrefix starts the per-token group that names the attested
	// node (by hash: group names cannot carry dots). The API server copies
	// it into every CSR the token makes, so the approver learns the
	// attested name from the request itself, with no state and no read
	// access to token Secrets.
	NodeGroupPrefix = "system:bootstrappers:latchkey:node:"
)

// A token Secret's labels and annotations are internal/kubekey's:
// LabelManagedBy, LabelNodeHash (NodeHash of the node name, so an
// operator can list one node's tokens), LabelRole, AnnotationNodeName
// (the attested node name) and AnnotationEvidenceDigest (the digest of
// the accepted evidence).

// ManagedSelector selects the token Secrets latchkey wrote.
const ManagedSelector = kubekey.LabelManagedBy + "=" + kubekey.ManagedBy

// SecretName is the name of the Secret of the token with this ID.
func SecretName(id string) string { return bootstrapapi.BootstrapTokenSecretPrefix + id }

// tokenAlphabet is kubeadm's: lower-case letters and digits.
const tokenAlphabet = "0123456789abcdefghijklmnopqrstuvwxyz"

// Lengths of a bootstrap token's public ID and secret.
const (
	idLen     = 6
	secretLen = 16
)

// NodeHash is the first 128 bits of SHA-256 over the node name, in hex.
// It names the node in the token's per-node group and label.
func NodeHash(node string) string {
	sum := sha256.Sum256([]byte(node))
	return hex.EncodeToString(sum[:16])
}

// NodeGroup is the per-node extra group of a token minted for node.
func NodeGroup(node string) string { return NodeGroupPrefix + NodeHash(node) }

// randomString draws n characters of tokenAlphabet from r without bias
// (rejection sampling: 252 is the largest multiple of 36 below 256).
func randomString(r io.Reader, n int) (string, error) {
	const limit = 256 - 256%len(tokenAlphabet)
	out := make([]byte, 0, n)
	buf := make([]byte, n*2)
	for len(out) < n {
		if _, err := io.ReadFull(r, buf); err != nil {
			return "", fmt.Errorf("read random bytes: %w", err)
		}
		for _, b := range buf {
			if int(b) < limit && len(out) < n {
				out = append(out, tokenAlphabet[int(b)%len(tokenAlphabet)])
			}
		}
	}
	return string(out), nil
}

// newTokenPair returns a fresh token ID and secret from r (crypto/rand
// when r is nil).
func newTokenPair(r io.Reader) (id, secret string, err error) {
	if r == nil {
		r = rand.Reader
	}
	if id, err = randomString(r, idLen); err != nil {
		return "", "", err
	}
	if secret, err = randomString(r, secretLen); err != nil {
		return "", "", err
	}
	return id, secret, nil
}

// validateRequest refuses a request whose node name could not be a
// Kubernetes node name or whose role is not one latchkey mints for.
func validateRequest(req Request) error {
	if errs := validation.IsDNS1123Subdomain(req.NodeName); len(errs) > 0 {
		return fmt.Errorf("%w: node name %q: %s", ErrBadRequest, req.NodeName, strings.Join(errs, "; "))
	}
	switch req.Role {
	case latchkeyv1.Role_ROLE_WORKER, latchkeyv1.Role_ROLE_CONTROL_PLANE:
	default:
		return fmt.Errorf("%w: role %v", ErrBadRequest, req.Role)
	}
	if len(req.EvidenceDigest) > 200 || strings.ContainsAny(req.EvidenceDigest, "\n\r") {
		return fmt.Errorf("%w: evidence digest is not a digest", ErrBadRequest)
	}
	return nil
}

// roleLabel is the kubekey.LabelRole value (protocol's role names).
func roleLabel(r latchkeyv1.Role) string {
	if r == latchkeyv1.Role_ROLE_CONTROL_PLANE {
		return protocol.RoleControlPlane
	}
	return protocol.RoleWorker
}

// groupsFor lists the token's extra groups.
func groupsFor(req Request) []string {
	groups := []string{Group, NodeGroup(req.NodeName)}
	if req.Role == latchkeyv1.Role_ROLE_CONTROL_PLANE {
		groups = append(groups, ControlPlaneGroup)
	}
	return groups
}

// bootstrapSecret builds the kubeadm-style bootstrap-token Secret.
// bootstrapSecret is the token Secret. A token for file discovery is for
// authentication only: without the signing usage the bootstrap signer
// never adds it to cluster-info, so cluster-info is not rewritten per
// node (at 10,000 live signing tokens it passes etcd's request limit).
func bootstrapSecret(id, secret string, req Request, expiry time.Time, signing bool) *corev1.Secret {
	s := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Name:      bootstrapapi.BootstrapTokenSecretPrefix + id,
			Namespace: metav1.NamespaceSystem,
			Labels: map[string]string{
				kubekey.LabelManagedBy: kubekey.ManagedBy,
				kubekey.LabelNodeHash:  NodeHash(req.NodeName),
				kubekey.LabelRole:      roleLabel(req.Role),
			},
			Annotations: map[string]string{
				kubekey.AnnotationNodeName:       req.NodeName,
				kubekey.AnnotationEvidenceDigest: req.EvidenceDigest,
			},
		},
		Type: bootstrapapi.SecretTypeBootstrapToken,
		Data: map[string][]byte{
			bootstrapapi.BootstrapTokenIDKey:               []byte(id),
			bootstrapapi.BootstrapTokenSecretKey:           []byte(secret),
			bootstrapapi.BootstrapTokenExpirationKey:       []byte(expiry.UTC().Format(time.RFC3339)),
			bootstrapapi.BootstrapTokenUsageAuthentication: []byte("true"),
			bootstrapapi.BootstrapTokenExtraGroupsKey:      []byte(strings.Join(groupsFor(req), ",")),
			bootstrapapi.BootstrapTokenDescriptionKey:      []byte(description(req)),
		},
	}
	if signing {
		s.Data[bootstrapapi.BootstrapTokenUsageSigningKey] = []byte("true")
	}
	return s
}

func description(req Request) string {
	d := fmt.Sprintf("latchkey %s token for node %s", roleLabel(req.Role), req.NodeName)
	if req.EvidenceDigest != "" {
		d += ", evidence " + req.EvidenceDigest
	}
	return d
}

// ValidID reports whether id could be a bootstrap token ID.
func ValidID(id string) bool {
	if len(id) != idLen {
		return false
	}
	for _, c := range id {
		if !strings.ContainsRune(tokenAlphabet, c) {
			return false
		}
	}
	return true
}
