// Package duration is a time.Duration that reads and writes as "30s" in
// the programs' YAML config files (which strictyaml decodes through JSON,
// where a plain time.Duration would be a number of nanoseconds).
package duration

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// Duration is a time.Duration written as "30s".
type Duration struct{ time.Duration }

// UnmarshalJSON reads "30s"-style durations. A bare number or boolean is
// read as its text, so `90` is refused for its missing unit rather than
// for its type.
func (d *Duration) UnmarshalJSON(b []byte) error {
	s, err := scalarText(b)
	if err != nil {
		return fmt.Errorf("duration: want a string like \"30s\": %w", err)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	d.Duration = v
	return nil
}

// scalarText is the text of a JSON scalar: a string's value, a number or
// boolean as written; null is empty.
func scalarText(b []byte) (string, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return "", err
	}
	switch t := v.(type) {
	case string:
		return t, nil
	case json.Number:
		return t.String(), nil
	case bool, nil:
		return string(bytes.TrimSpace(b)), nil
	}
	return "", errors.New("got a mapping or a list")
}

// MarshalJSON writes "30s"-style durations.
func (d Duration) MarshalJSON() ([]byte, error) { return []byte(`"` + d.String() + `"`), nil }
