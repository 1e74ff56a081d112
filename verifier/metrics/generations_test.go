package metrics

import (
	"strings"
	"testing"

	"github.com/latchkey/latchkey/verifier/keys"
)

func TestGenerationMetrics(t *testing.T) {
	m := New()
	m.MasterSecretsLoaded([]keys.GenerationInfo{{Generation: 0, KeyID: "kid-00"}, {Generation: 3, KeyID: "kid-33", Current: true}})
	m.DisksByKeyGeneration(map[string]int{"0": 2, "3": 5, GenerationUnknown: 1})
	got := scrape(t, m)
	for series, want := range map[string]string{
		`latchkey_verifier_master_secret_info{generation="0",key_id="kid-00"}`: "1",
		`latchkey_verifier_master_secret_info{generation="3",key_id="kid-33"}`: "1",
		`latchkey_verifier_master_secret_current_generation`:                   "3",
		`latchkey_verifier_disks_by_key_generation{generation="0"}`:            "2",
		`latchkey_verifier_disks_by_key_generation{generation="3"}`:            "5",
		`latchkey_verifier_disks_by_key_generation{generation="unknown"}`:      "1",
	} {
		if got[series] != want {
			t.Errorf("%s = %q, want %s", series, got[series], want)
		}
	}
	// The value is the generation, not a label: one series, whatever
	// the generation (a label would leave a stale series per rotation).
	for series := range got {
		if strings.HasPrefix(series, "latchkey_verifier_master_secret_current_generation{") {
			t.Errorf("current generation carried in a label: %s", series)
		}
	}
	m.MasterSecretsLoaded([]keys.GenerationInfo{{Generation: 4, KeyID: "kid-44", Current: true}})
	if got := scrape(t, m)[`latchkey_verifier_master_secret_current_generation`]; got != "4" {
		t.Errorf("after rotation to 4: current generation %q", got)
	}
	// A later count replaces the earlier one: a generation with no disk left disappears.
	m.DisksByKeyGeneration(map[string]int{"3": 8})
	got = scrape(t, m)
	if _, ok := got[`latchkey_verifier_disks_by_key_generation{generation="0"}`]; ok || got[`latchkey_verifier_disks_by_key_generation{generation="3"}`] != "8" {
		t.Errorf("after recount: %v", got)
	}
}
