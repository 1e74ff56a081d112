package tpm

import (
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"errors"
	"fmt"
	"slices"
	"time"
)

// oidSubjectAltName is the X.509 subjectAltName extension.
var oidSubjectAltName = asn1.ObjectIdentifier{2, 5, 29, 17}

// directoryNameTag is the GeneralName CHOICE tag of a directoryName.
const directoryNameTag = 4

// verifyEKCert checks that cert certifies ek and chains to roots. The TCG
// EK credential profile gives EK certificates an empty subject and a
// critical subjectAltName holding a directoryName (TPM maker, model and
// version), which Go's x509 does not interpret and so refuses as an
// unhandled critical extension. That one extension is checked here and
// then marked handled; any other unhandled critical extension still fails.
// EK certificates carry the TCG EK purpose (2.23.133.8.1) rather than a Go
// known extended key usage, hence ExtKeyUsageAny.
func verifyEKCert(cert *x509.Certificate, roots *x509.CertPool, ek *rsa.PublicKey, now time.Time) error {
	certKey, ok := cert.PublicKey.(*rsa.PublicKey)
	if !ok || !certKey.Equal(ek) {
		return errors.New("ek certificate certifies another key")
	}
	if err := handleTPMSubjectAltName(cert); err != nil {
		return err
	}
	_, err := cert.Verify(x509.VerifyOptions{
		Roots:       roots,
		CurrentTime: now,
		KeyUsages:   []x509.ExtKeyUsage{x509.ExtKeyUsageAny},
	})
	if err != nil {
		return fmt.Errorf("ek certificate: %w", err)
	}
	return nil
}

// handleTPMSubjectAltName removes the subjectAltName from cert's unhandled
// critical extensions once it has checked that the extension holds only
// well-formed directoryNames. cert must be a private copy (it is: each
// validation parses its own).
func handleTPMSubjectAltName(cert *x509.Certificate) error {
	if !slices.ContainsFunc(cert.UnhandledCriticalExtensions, oidSubjectAltName.Equal) {
		return nil
	}
	for _, ext := range cert.Extensions {
		if ext.Id.Equal(oidSubjectAltName) {
			if err := checkDirectoryNames(ext.Value); err != nil {
				return fmt.Errorf("ek certificate subjectAltName: %w", err)
			}
		}
	}
	cert.UnhandledCriticalExtensions = slices.DeleteFunc(cert.UnhandledCriticalExtensions, oidSubjectAltName.Equal)
	return nil
}

// checkDirectoryNames parses GeneralNames and accepts only directoryName
// entries, each a valid X.501 Name.
func checkDirectoryNames(der []byte) error {
	var names []asn1.RawValue
	if rest, err := asn1.Unmarshal(der, &names); err != nil || len(rest) > 0 || len(names) == 0 {
		return errors.New("not a non-empty GeneralNames sequence")
	}
	for _, n := range names {
		if n.Class != asn1.ClassContextSpecific || n.Tag != directoryNameTag || !n.IsCompound {
			return fmt.Errorf("name of tag %d is not a directoryName", n.Tag)
		}
		var rdn pkix.RDNSequence
		if rest, err := asn1.Unmarshal(n.Bytes, &rdn); err != nil || len(rest) > 0 {
			return errors.New("malformed directoryName")
		}
	}
	return nil
}
