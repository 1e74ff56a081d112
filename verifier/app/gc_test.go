package app

import "testing"

// TestGCHeadroomLeavesTheOperatorsChoice: with GOGC or GOMEMLIMIT in the
// environment nothing is reserved; without, the floor is reserved once.
func TestGCHeadroomLeavesTheOperatorsChoice(t *testing.T) {
	for _, env := range []string{"GOGC", "GOMEMLIMIT"} {
		t.Setenv("GOGC", "")
		t.Setenv("GOMEMLIMIT", "")
		t.Setenv(env, "200")
		ReserveGCHeadroom()
		if headroom != nil {
			t.Fatalf("%s set: %d bytes reserved anyway", env, len(headroom))
		}
	}
	t.Setenv("GOGC", "")
	t.Setenv("GOMEMLIMIT", "")
	ReserveGCHeadroom()
	first := &headroom[0]
	ReserveGCHeadroom()
	if len(headroom) != GCHeadroom || &headroom[0] != first {
		t.Fatalf("reserved %d bytes (want %d, once)", len(headroom), GCHeadroom)
	}
}
