// Package csr holds the verifier's controllers that act on what a node
// does with its bootstrap token: the Approver signs off a kubelet's
// client certificate only for the node name that was attested for the
// token, and the Reaper deletes the token once the node has used it.
//
// Both are controllers (informers over CSRs and Nodes), apart from
// verifier/token, which mints and revokes tokens and owns their Secret's
// schema; they read that schema (groups, token IDs) from token.
package csr
