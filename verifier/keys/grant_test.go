package keys

import (
	"bytes"
	"testing"
)

// The grant key follows the current generation: the same secret gives the
// same key on every replica, another current generation another key.
func TestGrantKeyFollowsCurrentGeneration(t *testing.T) {
	a, b := bytes.Repeat([]byte{1}, 32), bytes.Repeat([]byte{2}, 32)
	salt := []byte("cluster")
	d1, err := NewGenerations([]Secret{{Generation: 0, Bytes: a}, {Generation: 1, Bytes: b}}, 0, salt)
	if err != nil {
		t.Fatal(err)
	}
	d1again, _ := NewGenerations([]Secret{{Generation: 0, Bytes: a}}, 0, salt)
	d2, _ := NewGenerations([]Secret{{Generation: 0, Bytes: a}, {Generation: 1, Bytes: b}}, 1, salt)
	k1, err := d1.GrantKey()
	if err != nil {
		t.Fatal(err)
	}
	k1again, _ := d1again.GrantKey()
	k2, _ := d2.GrantKey()
	if !k1.Equal(k1again) {
		t.Fatal("the same current secret gave two grant keys")
	}
	if k1.Equal(k2) {
		t.Fatal("a rotation kept the grant key")
	}
}
