// Package protocol holds what the agent and the verifier must agree on
// beyond the messages of proto/latchkey/v1: the size of the disk key a
// ticket carries, the one form a disk UUID takes, and the names of the
// node roles in configuration, labels and command output.
//
// Both sides import it, and so may every stage on either side; it
// imports nothing of latchkey's but the generated messages, so the
// import direction stays agent -> protocol <- verifier.
package protocol

import (
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

// DiskKeySize is the length of a disk key: the verifier derives this
// many bytes (HKDF-SHA-256) and the agent refuses a ticket whose key has
// any other length.
const DiskKeySize = 32

// ValidDiskUUID reports whether s is a canonical lower-case UUID, the
// only form a disk UUID may take on the wire, in configuration and in a
// LUKS header latchkey wrote (so one disk has one key): it matches
// ^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$, checked
// by hand so that no regexp is compiled when a binary starts.
func ValidDiskUUID(s string) bool {
	if len(s) != 36 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch i {
		case 8, 13, 18, 23:
			if c != '-' {
				return false
			}
		default:
			if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
				return false
			}
		}
	}
	return true
}

// The names of the roles.
const (
	RoleWorker       = "worker"
	RoleControlPlane = "control-plane"
)

// RoleName is r's name, "" for a role latchkey does not mint for.
func RoleName(r latchkeyv1.Role) string {
	switch r {
	case latchkeyv1.Role_ROLE_WORKER:
		return RoleWorker
	case latchkeyv1.Role_ROLE_CONTROL_PLANE:
		return RoleControlPlane
	default:
		return ""
	}
}

// ParseRole is the role named s; ok is false for any other string
// (matching is exact: "Worker" is not a role).
func ParseRole(s string) (r latchkeyv1.Role, ok bool) {
	switch s {
	case RoleWorker:
		return latchkeyv1.Role_ROLE_WORKER, true
	case RoleControlPlane:
		return latchkeyv1.Role_ROLE_CONTROL_PLANE, true
	default:
		return latchkeyv1.Role_ROLE_UNSPECIFIED, false
	}
}
