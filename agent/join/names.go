package join

import (
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
)

// The checks below are hand-written instead of regular expressions so
// that nothing is compiled when the agent starts; names_test.go holds
// each to the expression (or upstream function) it replaces.

// maxSubdomain is a DNS (RFC 1123) subdomain's maximum length.
const maxSubdomain = 253

// isLowerAlnum reports whether c is in [a-z0-9].
func isLowerAlnum(c byte) bool { return c >= 'a' && c <= 'z' || c >= '0' && c <= '9' }

// isLowerHex reports whether c is in [0-9a-f].
func isLowerHex(c byte) bool { return c >= 'a' && c <= 'f' || c >= '0' && c <= '9' }

// all reports whether s is not empty and every byte of it passes ok.
func all(s string, ok func(byte) bool) bool {
	for i := 0; i < len(s); i++ {
		if !ok(s[i]) {
			return false
		}
	}
	return s != ""
}

// ValidNodeName reports whether name is a DNS-1123 subdomain of at most
// 253 characters, Kubernetes' rule for node names; the agent's
// configuration checks it before any network, without a regexp compiled
// at start.
func ValidNodeName(name string) bool { return nodeNameError(name) == "" }

// nodeNameError says why name is not a DNS-1123 subdomain (Kubernetes'
// rule for node names), or "" when it is one.
func nodeNameError(name string) string {
	if len(name) > maxSubdomain {
		return "must be no more than 253 characters"
	}
	if !isSubdomain(name) {
		return "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character"
	}
	return ""
}

// isSubdomain matches [a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*
// on the whole of s.
func isSubdomain(s string) bool {
	start := 0
	for i := 0; i <= len(s); i++ {
		if i < len(s) && s[i] != '.' {
			if !isLowerAlnum(s[i]) && s[i] != '-' {
				return false
			}
			continue
		}
		label := s[start:i]
		if label == "" || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		start = i + 1
	}
	return true
}

// isToken matches a bootstrap token, ^[a-z0-9]{6}\.[a-z0-9]{16}$.
func isToken(s string) bool {
	return len(s) == 23 && s[6] == '.' && all(s[:6], isLowerAlnum) && all(s[7:], isLowerAlnum)
}

// isPin matches a CA cert hash, ^sha256:[0-9a-f]{64}$.
func isPin(s string) bool {
	rest, ok := cutPrefix(s, "sha256:")
	return ok && len(rest) == 64 && all(rest, isLowerHex)
}

// isCertificateKey matches ^[0-9a-f]{64}$.
func isCertificateKey(s string) bool { return len(s) == 64 && all(s, isLowerHex) }

func cutPrefix(s, prefix string) (string, bool) {
	if len(s) < len(prefix) || s[:len(prefix)] != prefix {
		return s, false
	}
	return s[len(prefix):], true
}

// pin is kubeadm's CA cert hash of c (its pubkeypin.Hash): the SHA-256
// of the certificate's DER SubjectPublicKeyInfo.
func pin(c *x509.Certificate) string {
	sum := sha256.Sum256(c.RawSubjectPublicKeyInfo)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// parseCertsPEM is client-go's cert.ParseCertsPEM: every CERTIFICATE
// block without headers, other blocks skipped, at least one required.
func parseCertsPEM(data []byte) ([]*x509.Certificate, error) {
	var certs []*x509.Certificate
	for len(data) > 0 {
		var block *pem.Block
		block, data = pem.Decode(data)
		if block == nil {
			break
		}
		if block.Type != "CERTIFICATE" || len(block.Headers) != 0 {
			continue
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, err
		}
		certs = append(certs, c)
	}
	if len(certs) == 0 {
		return nil, errors.New("data does not contain any valid RSA or ECDSA certificates")
	}
	return certs, nil
}
