// Package duration is a time.Duration that reads and writes as "30s" in
// the programs' YAML config files (sigs.k8s.io/yaml goes through JSON,
// where a plain time.Duration would be a number of nanoseconds).
package duration

import (
	"fmt"
	"time"

	"sigs.k8s.io/yaml"
)

// Duration is a time.Duration written as "30s".
type Duration struct{ time.Duration }

// UnmarshalJSON reads "30s"-style durations.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := yaml.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("duration: want a string like \"30s\": %w", err)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	d.Duration = v
	return nil
}

// MarshalJSON writes "30s"-style durations.
func (d Duration) MarshalJSON() ([]byte, error) { return []byte(`"` + d.String() + `"`), nil }
