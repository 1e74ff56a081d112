// Package token mints the kubeadm bootstrap token a ticket carries, and
// revokes it when the ticket never reached the agent.
//
// The verifier owns a minted token until the agent acknowledges the ticket:
// a failure before that revokes it (nobody else can name it), a failure
// after it never does, and a mint that failed revokes nothing.
package token

import (
	"context"
	"time"

	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

// Request describes the node a token is for.
type Request struct {
	NodeName string
	Role     latchkeyv1.Role
	// EvidenceDigest is "sha256:<hex>" of the evidence that was accepted.
	EvidenceDigest string
	// Record, when set, is called once with the token's ID as soon as the
	// ID is fixed (its Secret written), concurrently with the rest of the
	// mint (the signature wait); the verifier writes the ID to the node's
	// binding there. An error fails the mint, which then deletes the
	// token. Mint returns only after Record has returned. A Minter may
	// also never call it; the caller then records the ID itself.
	Record func(ctx context.Context, id string) error
}

// Grant is a minted token together with what a joining node needs with it.
type Grant struct {
	// ID is the public token ID (the Secret is bootstrap-token-<ID>).
	ID string
	// Token is "<id>.<secret>". Never logged.
	Token string
	// Expiry is when the token stops working.
	Expiry time.Time
	// Endpoints are host:port of the API servers.
	Endpoints []string
	// CACertHashes are the "sha256:<hex>" SPKI pins of every cluster CA.
	CACertHashes []string
	// CertificateKey is the kubeadm certificate key, control-plane only.
	// Never logged.
	CertificateKey string
	// CABundle is the PEM of the pinned cluster CAs, for file discovery
	// (empty with token discovery).
	CABundle []byte
}

// Minter mints and revokes bootstrap tokens. A nil Minter in the verifier
// means disk-only mode: tickets carry the disk key and no token.
type Minter interface {
	Mint(ctx context.Context, req Request) (*Grant, error)
	// Revoke deletes the token with this ID and anything owned by it.
	Revoke(ctx context.Context, id string) error
}
