package strictyaml

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strconv"
	"unicode"

	"go.yaml.in/yaml/v3"
)

// Marshal renders v (a value encoding/json can marshal, fields named by
// their json tags) as YAML, byte for byte as sigs.k8s.io/yaml's Marshal
// does: JSON first, then YAML with keys in yaml v2's order, two-space
// indents, sequences not indented under their key, and a string quoted
// whenever a YAML 1.1 reader (such as kubeadm's sigs.k8s.io/yaml) would
// take it for anything else. One difference: a scalar with spaces that
// runs past column 80 stays on one line, where yaml v2 folds it (the same
// value to any reader; yaml v3 offers no line width). It exists so a program that writes YAML need not link
// sigs.k8s.io/yaml, whose go.yaml.in/yaml/v2 compiles regexps at every
// start.
func Marshal(v any) ([]byte, error) {
	j, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("yaml: %w", err)
	}
	dec := json.NewDecoder(bytes.NewReader(j))
	dec.UseNumber()
	n, err := node(dec)
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	enc.CompactSeqIndent()
	if err := enc.Encode(n); err != nil {
		return nil, fmt.Errorf("yaml: %w", err)
	}
	if err := enc.Close(); err != nil {
		return nil, fmt.Errorf("yaml: %w", err)
	}
	return buf.Bytes(), nil
}

// node reads the next JSON value from dec as a YAML node.
func node(dec *json.Decoder) (*yaml.Node, error) {
	tok, err := dec.Token()
	if err != nil {
		return nil, fmt.Errorf("yaml: %w", err)
	}
	switch t := tok.(type) {
	case json.Delim:
		return collection(dec, t)
	case string:
		return str(t)
	case json.Number:
		return number(t)
	case bool:
		return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!bool", Value: strconv.FormatBool(t)}, nil
	case nil:
		return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!null", Value: "null"}, nil
	}
	return nil, fmt.Errorf("yaml: unexpected JSON token %v", tok)
}

// collection reads a JSON object or array whose opening delim was read.
func collection(dec *json.Decoder, open json.Delim) (*yaml.Node, error) {
	if open == '[' {
		n := &yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq"}
		for dec.More() {
			c, err := node(dec)
			if err != nil {
				return nil, err
			}
			n.Content = append(n.Content, c)
		}
		return n, closeDelim(dec)
	}
	type pair struct {
		key  string
		k, v *yaml.Node
	}
	var pairs []pair
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, fmt.Errorf("yaml: %w", err)
		}
		key, ok := tok.(string)
		if !ok {
			return nil, errors.New("yaml: a JSON key that is not a string")
		}
		k, err := str(key)
		if err != nil {
			return nil, err
		}
		v, err := node(dec)
		if err != nil {
			return nil, err
		}
		pairs = append(pairs, pair{key, k, v})
	}
	// sigs.k8s.io/yaml goes through a Go map, which yaml v2 writes in its
	// own key order, not the JSON's.
	sort.SliceStable(pairs, func(i, j int) bool { return keyLess(pairs[i].key, pairs[j].key) })
	n := &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map"}
	for _, p := range pairs {
		n.Content = append(n.Content, p.k, p.v)
	}
	return n, closeDelim(dec)
}

// closeDelim reads the closing delim of an object or array.
func closeDelim(dec *json.Decoder) error {
	if _, err := dec.Token(); err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("yaml: %w", err)
	}
	return nil
}

// keyLess is go.yaml.in/yaml/v2's order of two string keys (its
// sorter.go): runs of digits compare as numbers, and a letter sorts
// before anything that is not one.
func keyLess(a, b string) bool {
	ar, br := []rune(a), []rune(b)
	for i := 0; i < len(ar) && i < len(br); i++ {
		if ar[i] == br[i] {
			continue
		}
		al, bl := unicode.IsLetter(ar[i]), unicode.IsLetter(br[i])
		if al && bl {
			return ar[i] < br[i]
		}
		if al || bl {
			return bl
		}
		var an, bn int64
		if ar[i] == '0' || br[i] == '0' {
			for j := i - 1; j >= 0 && unicode.IsDigit(ar[j]); j-- {
				if ar[j] != '0' {
					an, bn = 1, 1
					break
				}
			}
		}
		ai, bi := i, i
		for ; ai < len(ar) && unicode.IsDigit(ar[ai]); ai++ {
			an = an*10 + int64(ar[ai]-'0')
		}
		for ; bi < len(br) && unicode.IsDigit(br[bi]); bi++ {
			bn = bn*10 + int64(br[bi]-'0')
		}
		if an != bn {
			return an < bn
		}
		if ai != bi {
			return ai < bi
		}
		return ar[i] < br[i]
	}
	return len(ar) < len(br)
}

// str is s as the YAML encoder renders a Go string: plain when no reader
// would take it for another type (YAML 1.1's yes/no/on/off and base-60
// numbers included), double-quoted otherwise, literal when multi-line.
func str(s string) (*yaml.Node, error) {
	var n yaml.Node
	if err := n.Encode(s); err != nil {
		return nil, fmt.Errorf("yaml: %w", err)
	}
	if n.Tag == "!!merge" {
		n.Tag, n.Style = "", 0 // v2 writes "<<" bare
	}
	return &n, nil
}

// number renders a JSON number the way sigs.k8s.io/yaml does: an integer
// as written, anything else through float64 in Go's shortest form.
func number(num json.Number) (*yaml.Node, error) {
	if _, err := num.Int64(); err == nil {
		return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!int", Value: num.String()}, nil
	}
	if _, err := strconv.ParseUint(num.String(), 10, 64); err == nil {
		return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!int", Value: num.String()}, nil
	}
	f, err := num.Float64()
	if err != nil {
		return nil, fmt.Errorf("yaml: %w", err)
	}
	return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!float", Value: strconv.FormatFloat(f, 'g', -1, 64)}, nil
}
