package ticket

import (
	"bytes"
	"strings"
	"testing"

	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

func TestCheckGenerations(t *testing.T) {
	g := func(n uint32) *uint32 { return &n }
	key := func() []byte { return bytes.Repeat([]byte{7}, diskKeySize) }
	for _, tc := range []struct {
		name  string
		named *uint32
		t     *latchkeyv1.Ticket
		want  string // "" accepts
	}{
		{"first boot", nil, &latchkeyv1.Ticket{DiskKey: key(), KeyGeneration: 4}, ""},
		{"current", g(4), &latchkeyv1.Ticket{DiskKey: key(), KeyGeneration: 4}, ""},
		{"older, with its key", g(1), &latchkeyv1.Ticket{DiskKey: key(), KeyGeneration: 4, PreviousDiskKey: key(), PreviousKeyGeneration: 1}, ""},
		{"unasked previous", nil, &latchkeyv1.Ticket{DiskKey: key(), KeyGeneration: 4, PreviousDiskKey: key(), PreviousKeyGeneration: 1},
			"carries a previous-generation key (generation 1) the agent did not ask for"},
		{"older, no key", g(1), &latchkeyv1.Ticket{DiskKey: key(), KeyGeneration: 4},
			"keyed under master-secret generation 1 and the ticket's key is generation 4, with no key for 1"},
		{"older, wrong generation", g(1), &latchkeyv1.Ticket{DiskKey: key(), KeyGeneration: 4, PreviousDiskKey: key(), PreviousKeyGeneration: 2},
			"previous key is generation 2, the disk's header names 1"},
		{"older, short key", g(1), &latchkeyv1.Ticket{DiskKey: key(), KeyGeneration: 4, PreviousDiskKey: key()[:16], PreviousKeyGeneration: 1},
			"previous disk key is 16 bytes, want 32"},
	} {
		err := checkGenerations(Request{DiskKeyGeneration: tc.named}, tc.t)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		case tc.want != "" && (!bytes.Equal(tc.t.DiskKey, make([]byte, diskKeySize))):
			t.Errorf("%s: refused ticket's key not cleared", tc.name)
		}
	}
}
