// Package systemdunit reads settings from the systemd unit files
// latchkey ships, so tests can hold a unit to the code's contract (the
// exit codes RestartPreventExitStatus= names, for one).
package systemdunit

import (
	"fmt"
	"os"
	"regexp"
	"slices"
	"strconv"
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

// RestartColumn reads the first Markdown table after marker in doc, a
// table of exit codes whose first column is the code and whose last
// column says whether the unit restarts the program ("yes", "no", or "–"
// where it does not apply), and returns the first word of that cell by
// code.
func RestartColumn(doc []byte, marker string) (map[int]string, error) {
	_, rest, ok := strings.Cut(string(doc), marker)
	if !ok {
		return nil, fmt.Errorf("no %q in the document", marker)
	}
	row := regexp.MustCompile(`^\| (\d+) \|.*\| *([^|]*?) *\|$`)
	out := map[int]string{}
	inTable := false
	for _, line := range strings.Split(rest, "\n") {
		if !strings.HasPrefix(line, "|") {
			if inTable {
				break
			}
			continue
		}
		inTable = true
		m := row.FindStringSubmatch(line)
		if m == nil {
			continue // the header and its rule
		}
		code, err := strconv.Atoi(m[1])
		if err != nil {
			return nil, err
		}
		word, _, _ := strings.Cut(m[2], " ")
		out[code] = strings.TrimRight(word, ":,;")
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no exit-code table after %q", marker)
	}
	return out, nil
}

// CheckRestarts holds a documented exit-code table (RestartColumn) to a
// unit's RestartPreventExitStatus= list: a code is documented "no" exactly
// when the unit prevents its restart, every code the program uses (codes)
// and no other is documented, and 0 is "–".
func CheckRestarts(table map[int]string, prevent []string, codes []int) []error {
	var errs []error
	prevented := map[int]bool{}
	for _, p := range prevent {
		n, err := strconv.Atoi(p)
		if err != nil {
			errs = append(errs, fmt.Errorf("RestartPreventExitStatus= value %q is not a code", p))
		}
		prevented[n] = true
	}
	for _, code := range codes {
		cell, ok := table[code]
		switch {
		case !ok:
			errs = append(errs, fmt.Errorf("code %d is not documented", code))
		case code == 0 && cell != "–":
			errs = append(errs, fmt.Errorf("code 0 is documented as restarted %q, want –", cell))
		case code != 0 && prevented[code] && cell != "no":
			errs = append(errs, fmt.Errorf("code %d: the unit does not restart it, the docs say %q", code, cell))
		case code != 0 && !prevented[code] && cell != "yes" && cell != "–":
			errs = append(errs, fmt.Errorf("code %d: the unit restarts it, the docs say %q", code, cell))
		}
	}
	for code := range prevented {
		if !slices.Contains(codes, code) {
			errs = append(errs, fmt.Errorf("RestartPreventExitStatus= names %d, which the program never uses", code))
		}
	}
	for code := range table {
		if !slices.Contains(codes, code) {
			errs = append(errs, fmt.Errorf("code %d is documented but the program never uses it", code))
		}
	}
	return errs
}
