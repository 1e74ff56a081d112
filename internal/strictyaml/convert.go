package strictyaml

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"go.yaml.in/yaml/v3"
)

// maxDepth bounds nesting, so a hostile file cannot exhaust the stack.
const maxDepth = 64

// toJSON parses one YAML document and renders it as JSON. An empty file is
// an empty mapping; a second document is an error.
func toJSON(data []byte) ([]byte, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return []byte("{}"), nil
		}
		return nil, fmt.Errorf("yaml: %w", err)
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return nil, errors.New("yaml: more than one document")
	}
	v, err := value(&doc, "", 0)
	if err != nil {
		return nil, err
	}
	return json.Marshal(v)
}

// value converts one node. Scalars keep the type YAML 1.2's core schema
// resolves them to; numbers stay as written (json.Number).
func value(n *yaml.Node, path string, depth int) (any, error) {
	if depth > maxDepth {
		return nil, fmt.Errorf("yaml: nested deeper than %d levels at %q", maxDepth, path)
	}
	switch n.Kind {
	case yaml.DocumentNode:
		if len(n.Content) == 0 {
			return map[string]any{}, nil
		}
		return value(n.Content[0], path, depth+1)
	case yaml.AliasNode:
		return nil, fmt.Errorf("yaml: line %d: aliases are not accepted (key %q)", n.Line, path)
	case yaml.MappingNode:
		return mapping(n, path, depth)
	case yaml.SequenceNode:
		out := make([]any, len(n.Content))
		for i, c := range n.Content {
			v, err := value(c, fmt.Sprintf("%s[%d]", path, i), depth+1)
			if err != nil {
				return nil, err
			}
			out[i] = v
		}
		return out, nil
	}
	return scalar(n, path)
}

func mapping(n *yaml.Node, path string, depth int) (any, error) {
	out := make(map[string]any, len(n.Content)/2)
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if k.Kind != yaml.ScalarNode {
			return nil, fmt.Errorf("yaml: line %d: a key must be a plain value (under %q)", k.Line, path)
		}
		key := join(path, k.Value)
		if k.Value == "<<" {
			return nil, fmt.Errorf("yaml: line %d: merge keys are not accepted (key %q)", k.Line, key)
		}
		if _, dup := out[k.Value]; dup {
			return nil, fmt.Errorf("yaml: line %d: key %q already set in map", k.Line, key)
		}
		cv, err := value(v, key, depth+1)
		if err != nil {
			return nil, err
		}
		out[k.Value] = cv
	}
	return out, nil
}

func scalar(n *yaml.Node, path string) (any, error) {
	switch n.ShortTag() {
	case "!!null":
		return nil, nil
	case "!!bool":
		var b bool
		if err := n.Decode(&b); err != nil {
			return nil, fmt.Errorf("yaml: line %d: key %q: %w", n.Line, path, err)
		}
		return b, nil
	case "!!int", "!!float":
		var f float64
		if err := n.Decode(&f); err != nil {
			return nil, fmt.Errorf("yaml: line %d: key %q: %w", n.Line, path, err)
		}
		if json.Valid([]byte(n.Value)) {
			return json.Number(n.Value), nil
		}
		return f, nil // 0x1f, 1_000, .inf: YAML spellings JSON lacks
	}
	return n.Value, nil
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}
