// Package systemdunit reads settings from the systemd unit files
// latchkey ships, so tests can hold a unit to the code's contract (the
// exit codes RestartPreventExitStatus= names, for one).
package systemdunit

import (
	"fmt"
	"os"
	"regexp"
	"strings"
)

// Fields returns the whitespace-separated values of key in the unit file
// at path (the last assignment, as systemd reads a single-valued
// setting); an error when the file does not set key.
func Fields(path, key string) ([]string, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	ms := regexp.MustCompile(`(?m)^`+regexp.QuoteMeta(key)+`=(.*)$`).FindAllSubmatch(raw, -1)
	if len(ms) == 0 {
		return nil, fmt.Errorf("%s sets no %s=", path, key)
	}
	return strings.Fields(string(ms[len(ms)-1][1])), nil
}
