package strictyaml

import (
	"strings"
	"testing"
)

type inner struct {
	Salt string `json:"clusterSalt"`
}

type doc struct {
	Name    string   `json:"name"`
	List    []string `json:"list,omitempty"`
	Enabled bool     `json:"enabled,omitempty"`
	Inner   *inner   `json:"inner,omitempty"`
}

func TestUnmarshalAccepts(t *testing.T) {
	var d doc
	if err := Unmarshal([]byte("name: a\nlist: [x, y]\ninner:\n  clusterSalt: s\n"), &d); err != nil {
		t.Fatal(err)
	}
	if d.Name != "a" || len(d.List) != 2 || d.Inner == nil || d.Inner.Salt != "s" {
		t.Fatalf("decoded %+v", d)
	}
}

func TestUnmarshalRefuses(t *testing.T) {
	for _, tc := range []struct {
		name, yaml, want string
	}{
		{"unknown key", "name: a\nbogus: 1\n", `unknown field "bogus"`},
		{"case variant of a key", "Name: a\n", `unknown field "Name"`},
		{"case-variant duplicate", "inner:\n  clusterSalt: a\n  clustersalt: b\n", `unknown field "inner.clustersalt"`},
		{"exact duplicate", "name: a\nname: b\n", `key "name" already set in map`},
		{"wrong type names the key", "list: nope\n", `key "list": want a list, got string`},
		{"nested wrong type", "inner:\n  clusterSalt: [1]\n", `key "inner.clusterSalt": want a string, got array`},
		{"bool for a string", "enabled: maybe\n", `key "enabled": want true or false, got string`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var d doc
			err := Unmarshal([]byte(tc.yaml), &d)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want it to contain %q", err, tc.want)
			}
			if strings.Contains(err.Error(), "Go struct") || strings.Contains(err.Error(), "strictyaml.doc") {
				t.Fatalf("error names a Go type: %v", err)
			}
		})
	}
}

// A foreign file's keys that the struct does not name are ignored (a
// kubeconfig's preferences and extensions); duplicates are still refused,
// and a case variant of a named key is not taken for it.
func TestUnmarshalForeign(t *testing.T) {
	type kc struct {
		CurrentContext string `json:"current-context"`
	}
	var v kc
	if err := UnmarshalForeign([]byte("current-context: a\npreferences: {}\nextensions: [x]\n"), &v); err != nil || v.CurrentContext != "a" {
		t.Fatalf("unknown keys: %+v %v", v, err)
	}
	err := UnmarshalForeign([]byte("current-context: a\ncurrent-context: b\n"), &kc{})
	if err == nil || !strings.Contains(err.Error(), `key "current-context" already set`) {
		t.Fatalf("duplicate key: %v", err)
	}
	v = kc{}
	if err := UnmarshalForeign([]byte("Current-Context: evil\n"), &v); err != nil || v.CurrentContext != "" {
		t.Fatalf("case variant taken: %+v %v", v, err)
	}
}
