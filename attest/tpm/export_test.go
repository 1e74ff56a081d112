package tpm

import "github.com/google/go-tpm/tpm2"

// AKTemplateForTest is the AK's template, for tests that make a key like
// it in another hierarchy.
func AKTemplateForTest() tpm2.TPMTPublic { return akTemplate }
