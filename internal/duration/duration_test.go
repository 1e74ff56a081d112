package duration

import (
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"
)

func TestRoundTrip(t *testing.T) {
	var v struct {
		D Duration `json:"d"`
	}
	if err := yaml.Unmarshal([]byte("d: 90s\n"), &v); err != nil || v.D.Duration != 90*time.Second {
		t.Fatalf("%v %v", v.D, err)
	}
	out, _ := yaml.Marshal(v)
	if strings.TrimSpace(string(out)) != "d: 1m30s" {
		t.Fatalf("marshal: %q", out)
	}
	if err := yaml.Unmarshal([]byte("d: 90\n"), &v); err == nil || !strings.Contains(err.Error(), `missing unit in duration "90"`) {
		t.Fatalf("a bare number: err = %v", err)
	}
	if err := yaml.Unmarshal([]byte("d: soon\n"), &v); err == nil {
		t.Fatal("a bad duration was accepted")
	}
}

func TestNotAScalar(t *testing.T) {
	var v struct {
		D Duration `json:"d"`
	}
	for _, doc := range []string{"d: {a: 1}\n", "d: [1s]\n"} {
		if err := yaml.Unmarshal([]byte(doc), &v); err == nil || !strings.Contains(err.Error(), `want a string like "30s": got a mapping or a list`) {
			t.Fatalf("%q: err = %v", doc, err)
		}
	}
	if err := yaml.Unmarshal([]byte("d: true\n"), &v); err == nil || !strings.Contains(err.Error(), `invalid duration "true"`) {
		t.Fatalf("a boolean: err = %v", err)
	}
}
