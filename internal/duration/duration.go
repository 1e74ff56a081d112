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
// for its type. (One function: deadcode cannot see encoding/json call
// it, scripts/deadcode-allow.txt.)
func (d *Duration) UnmarshalJSON(b []byte) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return fmt.Errorf("duration: want a string like \"30s\": %w", err)
	}
	var s string
	switch t := v.(type) {
	case string:
		s = t
	case json.Number:
		s = t.String()
	case bool, nil:
		s = string(bytes.TrimSpace(b))
	default:
		return errors.New(`duration: want a string like "30s": got a mapping or a list`)
	}
	parsed, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	d.Duration = parsed
	return nil
}

// MarshalJSON writes "30s"-style durations.
func (d Duration) MarshalJSON() ([]byte, error) { return []byte(`"` + d.String() + `"`), nil }
