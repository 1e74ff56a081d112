package systemdunit

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestFields(t *testing.T) {
	p := filepath.Join(t.TempDir(), "x.service")
	os.WriteFile(p, []byte("[Service]\nRestartPreventExitStatus=1\nRestartPreventExitStatus=2 3\n# RestartSec=9\nRestartSec=5s\n"), 0o600)
	if got, err := Fields(p, "RestartPreventExitStatus"); err != nil || strings.Join(got, " ") != "2 3" {
		t.Fatalf("got %v, %v; want the last assignment [2 3]", got, err)
	}
	if _, err := Fields(p, "TimeoutStartSec"); err == nil || !strings.Contains(err.Error(), "sets no TimeoutStartSec=") {
		t.Fatalf("missing key: %v", err)
	}
}

func TestCheckRestarts(t *testing.T) {
	doc := []byte("intro\n\nExit codes:\n\n| code | meaning | restarted |\n| --- | --- | --- |\n" +
		"| 0 | ok | – |\n| 1 | failed | yes, after 5 s |\n| 2 | bad | no: fix it |\n| 3 | busy | – (never from serve) |\n\nafter\n\n| 9 | other table | no |\n")
	table, err := RestartColumn(doc, "Exit codes:")
	if err != nil {
		t.Fatal(err)
	}
	if len(table) != 4 || table[0] != "–" || table[1] != "yes" || table[2] != "no" || table[3] != "–" {
		t.Fatalf("table %v", table)
	}
	upTo := func(last int) []int {
		var codes []int
		for c := 0; c <= last; c++ {
			codes = append(codes, c)
		}
		return codes
	}
	if errs := CheckRestarts(table, []string{"2"}, upTo(3)); len(errs) != 0 {
		t.Fatalf("agreeing table: %v", errs)
	}
	for _, c := range []struct {
		prevent []string
		last    int
		want    string
	}{
		{[]string{"1", "2"}, 3, "code 1: the unit does not restart it, the docs say \"yes\""},
		{nil, 3, "code 2: the unit restarts it, the docs say \"no\""},
		{[]string{"2"}, 4, "code 4 is not documented"},
		{[]string{"2"}, 2, "code 3 is documented but the program never uses it"},
		{[]string{"2", "7"}, 3, "RestartPreventExitStatus= names 7, which the program never uses"},
	} {
		errs := CheckRestarts(table, c.prevent, upTo(c.last))
		if len(errs) != 1 || errs[0].Error() != c.want {
			t.Errorf("prevent %v last %d: %v, want [%s]", c.prevent, c.last, errs, c.want)
		}
	}
	if _, err := RestartColumn(doc, "Missing:"); err == nil {
		t.Error("a missing marker was accepted")
	}
}
