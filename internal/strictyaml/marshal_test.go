package strictyaml

import (
	"bytes"
	"fmt"
	"math"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// marshalDoc has every shape the programs render: nested maps and lists,
// empty ones, pointers, numbers, booleans, multi-line text.
type marshalDoc struct {
	APIVersion string            `json:"apiVersion"`
	Strings    []string          `json:"strings"`
	Empty      []string          `json:"empty"`
	Nil        []string          `json:"nil"`
	Map        map[string]string `json:"map,omitempty"`
	EmptyMap   map[string]int    `json:"emptyMap"`
	Ints       []int64           `json:"ints,omitempty"`
	Big        uint64            `json:"big"`
	Floats     []float64         `json:"floats,omitempty"`
	On         bool              `json:"on"`
	Inner      *inner            `json:"inner,omitempty"`
	Nested     [][]string        `json:"nested,omitempty"`
	Objects    []inner           `json:"objects,omitempty"`
	Bytes      []byte            `json:"bytes,omitempty"`
}

// Marshal renders byte for byte what sigs.k8s.io/yaml renders (the
// oracle: kubeadm reads the agent's files with it), for strings a YAML
// 1.1 reader would take for a bool, a number, a null, a timestamp or a
// merge key, which must come out quoted.
func TestMarshalMatchesSigsYAML(t *testing.T) {
	tricky := []string{"", "plain", "yes", "no", "y", "N", "on", "Off", "true", "False", "null", "~", "Null",
		"1", "0x1f", "0o17", "0755", "1_000", "1e3", ".inf", "-.Inf", ".nan", "1:20", "190:20:30.15", "2001-12-14",
		"2001-12-14T21:59:43.10-05:00", "<<", "- a", "a: b", "#c", "a #c", "'q'", `"q"`, "@x", "`x", "%x", "!x", "&x", "*x",
		"{x}", "[x]", "|", ">", "?", " lead", "trail ", "tab\tin", "multi\nline", "multi\nline\n", "unicode é ✓",
		"sha256:" + "0f0f", "unix:///run/containerd/containerd.sock", "[2001:db8::1]:6443", "abcdef.0123456789abcdef",
		"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n", "\x01ctl", "long " + string(bytes.Repeat([]byte("word"), 40))}
	docs := []any{
		marshalDoc{},
		marshalDoc{APIVersion: "kubeadm.k8s.io/v1beta4", Strings: tricky, Empty: []string{}, Map: map[string]string{"b": "1", "a": "yes", "on": "x"},
			EmptyMap: map[string]int{}, Ints: []int64{0, -1, math.MaxInt64, math.MinInt64}, Big: math.MaxUint64,
			Floats: []float64{0.5, 1, 1e21, 1e-7, 123456789.125, -0.25}, On: true, Inner: &inner{Salt: "no"},
			Nested: [][]string{{"a", "yes"}, {}, nil}, Objects: []inner{{Salt: "a"}, {Salt: "multi\nline"}}, Bytes: []byte("raw\x00bytes")},
		map[string]any{"z": 1, "a": []any{map[string]any{"k": "v", "e": map[string]any{}}, nil, true}},
		[]string{"top", "level"},
		"scalar",
	}
	for _, s := range tricky {
		docs = append(docs, map[string]string{s: s})
	}
	for _, d := range docs {
		want, err := yaml.Marshal(d)
		if err != nil {
			t.Fatal(err)
		}
		got, err := Marshal(d)
		if err != nil {
			t.Fatalf("%#v: %v", d, err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("Marshal(%#v):\n%s", d, lineDiff(got, want))
		}
	}
}

// What Marshal writes, the strict decoder reads back as the same value,
// also a long line yaml v2 would have folded.
func TestMarshalRoundTrips(t *testing.T) {
	in := doc{Name: strings.Repeat("yes ", 30), List: []string{"on", "1", "a: b"}, Enabled: true, Inner: &inner{Salt: "multi\nline"}}
	out, err := Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	var back doc
	if err := Unmarshal(out, &back); err != nil {
		t.Fatal(err)
	}
	if back.Name != in.Name || len(back.List) != 3 || back.List[2] != "a: b" || !back.Enabled || back.Inner.Salt != in.Inner.Salt {
		t.Fatalf("round trip of\n%s\ngave %+v", out, back)
	}
}

// A value encoding/json refuses is an error, not a panic or partial YAML.
func TestMarshalRefusesWhatJSONRefuses(t *testing.T) {
	if _, err := Marshal(map[string]any{"f": math.Inf(1)}); err == nil || err.Error() != "yaml: json: unsupported value: +Inf" {
		t.Fatalf("err = %v", err)
	}
}

// lineDiff lists the lines where got and want differ.
func lineDiff(got, want []byte) string {
	g, w := strings.Split(string(got), "\n"), strings.Split(string(want), "\n")
	var out strings.Builder
	for i := 0; i < len(g) || i < len(w); i++ {
		var a, b string
		if i < len(g) {
			a = g[i]
		}
		if i < len(w) {
			b = w[i]
		}
		if a != b {
			fmt.Fprintf(&out, "line %d: got %q, sigs.k8s.io/yaml %q\n", i+1, a, b)
		}
	}
	return out.String()
}
