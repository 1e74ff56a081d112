// Package strictyaml decodes the programs' YAML files (the agent's and the
// verifier's configuration, the verifier's policy) the way Kubernetes
// decodes its own strict configuration: keys match struct tags
// case-sensitively, and unknown keys, duplicate keys and case-variant
// duplicates are all errors.
//
// sigs.k8s.io/yaml's UnmarshalStrict is not enough on its own: it goes
// through encoding/json, which matches keys case-insensitively, so
// `clusterSalt: a` next to `clustersalt: b` was taken silently (the later
// one won, changing every disk key). Here the YAML is parsed as YAML 1.2
// (so `y`, `no` and `on` stay strings), converted to JSON with duplicate
// keys refused, then decoded with sigs.k8s.io/json's case-sensitive strict
// decoder, and every error is phrased in terms of the YAML key path, never
// a Go type or field name.
//
// Marshal writes YAML as sigs.k8s.io/yaml does (the agent's kubeadm files
// must match what kubeadm's own types render) without linking yaml v2.
package strictyaml

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	kjson "sigs.k8s.io/json"
)

// Unmarshal decodes data into v strictly. v must be a pointer to a struct
// whose fields carry json tags.
func Unmarshal(data []byte, v any) error {
	j, err := toJSON(data)
	if err != nil {
		return err
	}
	strict, err := kjson.UnmarshalStrict(j, v, kjson.DisallowDuplicateFields, kjson.DisallowUnknownFields)
	if err != nil {
		return describe(err)
	}
	return joinStrict(strict)
}

// describe rewrites encoding/json's type errors, which name the Go type
// ("Go struct field Config.verifiers of type string"), into the YAML key
// path and the kind of value wanted.
func describe(err error) error {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) && te.Field != "" {
		return fmt.Errorf("key %q: want %s, got %s", keyPath(te.Field), kindOf(te.Type.Kind().String()), te.Value)
	}
	msg := err.Error()
	if !strings.HasPrefix(msg, "json: ") {
		return err
	}
	return errors.New(strings.TrimPrefix(msg, "json: "))
}

// keyPath drops the names of embedded Go structs from encoding/json's
// field path ("tpm.Policy.pcrs" for a section that embeds a Policy type).
// Keys of latchkey's files all start in lower case (they are matched
// case-sensitively), so an upper-case element is never a YAML key.
func keyPath(field string) string {
	parts := strings.Split(field, ".")
	keep := parts[:0]
	for _, p := range parts {
		if p != "" && p[0] >= 'A' && p[0] <= 'Z' {
			continue
		}
		keep = append(keep, p)
	}
	return strings.Join(keep, ".")
}

// kindOf names a Go kind the way a YAML author thinks of it.
func kindOf(k string) string {
	switch k {
	case "slice", "array":
		return "a list"
	case "map", "struct":
		return "a mapping"
	case "string":
		return "a string"
	case "bool":
		return "true or false"
	case "ptr", "interface":
		return "a value"
	}
	return "a number"
}

// UnmarshalForeign decodes a YAML file latchkey reads but does not own
// (the kubelet's kubeconfig, written by kubeadm): keys match the struct's
// json tags case-sensitively and duplicate keys are errors as in
// Unmarshal, but keys v does not name are ignored, since the file's owner
// may add fields latchkey has no use for.
func UnmarshalForeign(data []byte, v any) error {
	j, err := toJSON(data)
	if err != nil {
		return err
	}
	strict, err := kjson.UnmarshalStrict(j, v, kjson.DisallowDuplicateFields)
	if err != nil {
		return describe(err)
	}
	return joinStrict(strict)
}

// joinStrict is sigs.k8s.io/json's strict-decoding findings as one error
// (nil when there are none).
func joinStrict(strict []error) error {
	if len(strict) == 0 {
		return nil
	}
	msgs := make([]string, len(strict))
	for i, e := range strict {
		msgs[i] = strings.TrimPrefix(e.Error(), "json: ")
	}
	return errors.New(strings.Join(msgs, "; "))
}
