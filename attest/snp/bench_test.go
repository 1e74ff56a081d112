package snp_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha512"
	"testing"

	"github.com/google/go-sev-guest/abi"

	"github.com/latchkey/latchkey/attest/snp"
	"github.com/latchkey/latchkey/attest/snp/snptest"
)

// benchJoins is how many distinct signed reports the benchmarks cycle
// through (each bound to its own binding, as on real sessions).
const benchJoins = 64

type signedJoin struct{ evidence, binding []byte }

func benchSetup(b *testing.B) (*snp.Validator, []signedJoin) {
	b.Helper()
	s := snptest.New(b)
	v := newValidator(b, s.Policy(), nil)
	joins := make([]signedJoin, benchJoins)
	for i := range joins {
		binding := newBinding(b)
		joins[i] = signedJoin{evidence: s.Evidence(binding), binding: binding}
	}
	// Warm the chain cache: the first join of a chip verifies its chain.
	if _, err := v.Validate(context.Background(), joins[0].evidence, joins[0].binding, nil); err != nil {
		b.Fatal(err)
	}
	return v, joins
}

// BenchmarkValidate is the verifier's cost of one SNP join from a chip
// whose chain is cached: decode, one report signature verification, the
// policy checks.
func BenchmarkValidate(b *testing.B) {
	v, joins := benchSetup(b)
	ctx := context.Background()
	b.Run("serial", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			j := joins[i%len(joins)]
			if _, err := v.Validate(ctx, j.evidence, j.binding, nil); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for i := 0; pb.Next(); i++ {
				j := joins[i%len(joins)]
				if _, err := v.Validate(ctx, j.evidence, j.binding, nil); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
}

// BenchmarkValidateFirstSight is the cost of a chip's first join after a
// start or policy reload: go-sev-guest's full chain verification.
func BenchmarkValidateFirstSight(b *testing.B) {
	s := snptest.New(b)
	p := s.Policy()
	binding := newBinding(b)
	evidence := s.Evidence(binding)
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		v := newValidator(b, p, nil)
		if _, err := v.Validate(ctx, evidence, binding, nil); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkP384Verify is the unavoidable part of a join: one bare
// ecdsa.VerifyASN1 on P-384 over the SHA-384 digest of a report's signed
// bytes, serial and parallel like BenchmarkValidate.
func BenchmarkP384Verify(b *testing.B) {
	key, err := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	if err != nil {
		b.Fatal(err)
	}
	report := make([]byte, abi.ReportSize)
	if _, err := rand.Read(report); err != nil {
		b.Fatal(err)
	}
	digest := sha512.Sum384(abi.SignedComponent(report))
	sig, err := ecdsa.SignASN1(rand.Reader, key, digest[:])
	if err != nil {
		b.Fatal(err)
	}
	b.Run("serial", func(b *testing.B) {
		for b.Loop() {
			if !ecdsa.VerifyASN1(&key.PublicKey, digest[:], sig) {
				b.Fatal("verify failed")
			}
		}
	})
	b.Run("parallel", func(b *testing.B) {
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if !ecdsa.VerifyASN1(&key.PublicKey, digest[:], sig) {
					b.Error("verify failed")
					return
				}
			}
		})
	})
}
