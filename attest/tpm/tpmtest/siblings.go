package tpmtest

import (
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
)

// StartSiblings starts n swtpms that are n different machines of one
// vendor: each has its own endorsement keys, and all EK certificates are
// issued by the same throwaway CA, so one policy's ekCARoots trusts them
// all (EKCARootsPEM is the same on each). Identity-binding tests use it:
// both TPMs attest, and only the EK tells them apart.
func StartSiblings(t testing.TB, n int) []*Simulator {
	t.Helper()
	dir := t.TempDir()
	var sims []*Simulator
	var caPEM []string
	for i := range n {
		d := filepath.Join(dir, strconv.Itoa(i))
		if i > 0 {
			// swtpm_localca reuses the CA it finds in its state directory.
			ca, err := readDir(filepath.Join(dir, "0", "ca"))
			if err == nil {
				err = writeDir(filepath.Join(d, "ca"), ca)
			}
			if err != nil {
				t.Fatalf("tpmtest: copy ca: %v", err)
			}
		}
		tmpl, err := manufacture(d)
		if err != nil {
			t.Fatalf("tpmtest: %v", err)
		}
		if i == 0 {
			caPEM = tmpl.caPEM
		} else if !slices.Equal(caPEM, tmpl.caPEM) {
			t.Fatal(fmt.Errorf("tpmtest: sibling %d was certified by another CA", i))
		}
		sims = append(sims, startFrom(t, tmpl))
	}
	return sims
}
