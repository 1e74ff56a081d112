package clitest

import (
	"slices"
	"testing"
)

func TestShellWords(t *testing.T) {
	for _, tc := range []struct {
		line string
		want []string
	}{
		{`latchkey-agent measure > measured.yaml`, []string{"latchkey-agent", "measure"}},
		{`latchkey-agent run --disk-uuid "$(cat /proc/sys/kernel/random/uuid)" --no-reattest`,
			[]string{"latchkey-agent", "run", "--disk-uuid", "$(cat /proc/sys/kernel/random/uuid)", "--no-reattest"}},
		{`latchkey-verifier pin | tee pin.txt`, []string{"latchkey-verifier", "pin"}},
		{`a 'b c' d # comment`, []string{"a", "b c", "d"}},
		{`a --x=1 && b`, []string{"a", "--x=1"}},
		{`# only a comment`, nil},
	} {
		if got := ShellWords(tc.line); !slices.Equal(got, tc.want) {
			t.Errorf("%q: %q, want %q", tc.line, got, tc.want)
		}
	}
}
