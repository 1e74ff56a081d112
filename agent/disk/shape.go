package disk

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
)

// The LUKS2 JSON metadata is judged as a tree, not through Go structs:
// encoding/json matches struct fields case-insensitively and lets a
// duplicate key silently override the first, and luks.go decodes with
// exactly those rules. A host could hide a second "segments" or a
// "Segments" that one reader sees and another does not. So the text is
// parsed token by token (duplicate keys refused), and the tree must equal
// the expected one key for key, value for value; only the random salts
// and the digest may vary, and they must be base64 of the right length.

type (
	obj     = map[string]any
	arr     = []any
	matcher func(v any) error
)

const maxJSONDepth = 8

// checkShape parses js strictly and compares it with the shape latchkey
// creates.
func checkShape(js []byte) error {
	tree, err := parseStrictJSON(js)
	if err != nil {
		return fmt.Errorf("JSON metadata: %v", err)
	}
	want := expectedShape()
	want["tokens"] = offlineTokenShape(tree) // offline_token.go
	// Keys first, everywhere, then values: an added keyslot is reported
	// as such rather than as the digest list that grew with it.
	if err := compareTree("", want, tree, true); err != nil {
		return err
	}
	return compareTree("", want, tree, false)
}

func expectedShape() obj {
	n := func(i int) json.Number { return json.Number(strconv.Itoa(i)) }
	s := func(i int) string { return strconv.Itoa(i) }
	return obj{
		"keyslots": obj{"0": obj{
			"type":     "luks2",
			"key_size": n(volumeKeyBytes),
			"af":       obj{"type": "luks1", "stripes": n(afStripes), "hash": luksHash},
			"area": obj{"type": "raw", "offset": oneOf(s(areaA), s(areaB)), "size": s(keyslotAreaSize),
				"encryption": luksCipher, "key_size": n(volumeKeyBytes)},
			"kdf": obj{"type": "pbkdf2", "hash": luksHash, "iterations": n(kdfIterations),
				"salt": base64Of(saltBytes)},
		}},
		"tokens": obj{},
		"segments": obj{"0": obj{
			"type": "crypt", "offset": s(DataOffset), "size": "dynamic", "iv_tweak": "0",
			"encryption": luksCipher, "sector_size": n(sectorSize),
		}},
		"digests": obj{"0": obj{
			"type": "pbkdf2", "keyslots": arr{"0"}, "segments": arr{"0"}, "hash": luksHash,
			"iterations": n(kdfIterations), "salt": base64Of(saltBytes), "digest": base64Of(sha256Size),
		}},
		"config": obj{"json_size": s(jsonAreaSize), "keyslots_size": s(keyslotsSize)},
	}
}

const sha256Size = 32

// oneOf matches any of the given strings (keyslot 0's two areas).
func oneOf(values ...string) matcher {
	return func(v any) error {
		for _, w := range values {
			if v == w {
				return nil
			}
		}
		return fmt.Errorf("is %s, want one of %q", describe(v), values)
	}
}

// base64Of matches a standard-base64 string of exactly n bytes.
func base64Of(n int) matcher {
	return func(v any) error {
		s, ok := v.(string)
		if !ok {
			return fmt.Errorf("is %s, want a base64 string", describe(v))
		}
		b, err := base64.StdEncoding.Strict().DecodeString(s)
		if err != nil || len(b) != n {
			return fmt.Errorf("is not base64 of %d bytes", n)
		}
		return nil
	}
}

// compareTree returns the first difference between want and got, naming
// its path (for example "segments.0.encryption"). keysOnly compares just
// the object keys.
func compareTree(path string, want, got any, keysOnly bool) error {
	switch w := want.(type) {
	case obj:
		return compareObject(path, w, got, keysOnly)
	}
	if keysOnly {
		return nil
	}
	switch w := want.(type) {
	case arr:
		g, ok := got.([]any)
		if !ok || len(g) != len(w) {
			return fmt.Errorf("%s is %s, want a list of %d", pathName(path), describe(got), len(w))
		}
		for i := range w {
			if err := compareTree(path+"."+strconv.Itoa(i), w[i], g[i], false); err != nil {
				return err
			}
		}
		return nil
	case matcher:
		if err := w(got); err != nil {
			return fmt.Errorf("%s %v", pathName(path), err)
		}
		return nil
	}
	if want != got {
		return fmt.Errorf("%s is %s, want %s", pathName(path), describe(got), describe(want))
	}
	return nil
}

func compareObject(path string, w obj, got any, keysOnly bool) error {
	g, ok := got.(map[string]any)
	if !ok {
		return fmt.Errorf("%s is %s, want an object", pathName(path), describe(got))
	}
	for _, k := range sortedKeys(g) {
		if _, ok := w[k]; !ok {
			return fmt.Errorf("%s has unexpected %q", pathName(path), k)
		}
	}
	for _, k := range sortedKeys(w) {
		v, ok := g[k]
		if !ok {
			return fmt.Errorf("%s lacks %q", pathName(path), k)
		}
		if err := compareTree(join(path, k), w[k], v, keysOnly); err != nil {
			return err
		}
	}
	return nil
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

func join(path, k string) string {
	if path == "" {
		return k
	}
	return path + "." + k
}

func pathName(path string) string {
	if path == "" {
		return "metadata"
	}
	return path
}

func describe(v any) string {
	switch t := v.(type) {
	case string:
		return strconv.Quote(t)
	case json.Number:
		return "number " + string(t)
	case map[string]any:
		return "an object"
	case []any:
		return fmt.Sprintf("a list of %d", len(t))
	case nil:
		return "null"
	}
	return fmt.Sprintf("%v", v)
}

// parseStrictJSON parses one JSON document into map[string]any / []any /
// string / json.Number / bool / nil, refusing duplicate keys, nesting
// deeper than maxJSONDepth and trailing data.
func parseStrictJSON(data []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	v, err := parseValue(dec, 0)
	if err != nil {
		return nil, err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, errors.New("trailing data after the document")
	}
	return v, nil
}

func parseValue(dec *json.Decoder, depth int) (any, error) {
	if depth > maxJSONDepth {
		return nil, errors.New("nested too deeply")
	}
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	switch tok {
	case json.Delim('{'):
		return parseObject(dec, depth)
	case json.Delim('['):
		return parseArray(dec, depth)
	}
	return tok, nil
}

func parseObject(dec *json.Decoder, depth int) (any, error) {
	m := map[string]any{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, err
		}
		key, ok := tok.(string)
		if !ok {
			return nil, fmt.Errorf("object key %v is not a string", tok)
		}
		if _, dup := m[key]; dup {
			return nil, fmt.Errorf("duplicate key %q", key)
		}
		if m[key], err = parseValue(dec, depth+1); err != nil {
			return nil, err
		}
	}
	_, err := dec.Token() // the closing '}'
	return m, err
}

func parseArray(dec *json.Decoder, depth int) (any, error) {
	a := []any{}
	for dec.More() {
		v, err := parseValue(dec, depth+1)
		if err != nil {
			return nil, err
		}
		a = append(a, v)
	}
	_, err := dec.Token() // the closing ']'
	return a, err
}
