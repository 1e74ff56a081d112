package luks2

import (
	"encoding/json"
	"strings"
	"testing"
)

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

func TestStrictJSON(t *testing.T) {
	cases := map[string]string{
		`{"a":1,"a":2}`:               `duplicate key "a"`,
		`{"a":{"b":1,"b":1}}`:         `duplicate key "b"`,
		`{"a":1} {"b":2}`:             "trailing data",
		`{"a":[[[[[[[[[[1]]]]]]]]]]}`: "nested too deeply",
		`{"a":`:                       "EOF",
	}
	for in, want := range cases {
		if _, err := parseStrictJSON([]byte(in)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("parseStrictJSON(%s) = %v, want %q", in, err, want)
		}
	}
	v, err := parseStrictJSON([]byte(`{"a":["x",2,true,null],"A":{}}`))
	if err != nil {
		t.Fatal(err)
	}
	if m := v.(map[string]any); len(m) != 2 { // case-sensitive: "a" and "A" are two keys
		t.Fatalf("tree = %v", v)
	}
}

func TestCompareTreeNamesTheDifference(t *testing.T) {
	want := obj{"s": obj{"0": obj{"enc": "aes", "n": json.Number("4096"), "salt": base64Of(4)}}, "l": arr{"0"}}
	cases := []struct{ in, msg string }{
		{`{"s":{"0":{"enc":"aes","n":4096,"salt":"AAAAAA=="}},"l":["0"]}`, ""},
		{`{"s":{"0":{"enc":"null","n":4096,"salt":"AAAAAA=="}},"l":["0"]}`, `s.0.enc is "null", want "aes"`},
		{`{"s":{"0":{"enc":"aes","n":"4096","salt":"AAAAAA=="}},"l":["0"]}`, `s.0.n is "4096", want number 4096`},
		{`{"s":{"0":{"enc":"aes","n":4096,"salt":"AAAA"}},"l":["0"]}`, `s.0.salt is not base64 of 4 bytes`},
		{`{"s":{"0":{"enc":"aes","n":4096,"salt":"AAAAAA=="},"1":{}},"l":["0"]}`, `s has unexpected "1"`},
		{`{"s":{"0":{"enc":"aes","n":4096,"salt":"AAAAAA=="}},"l":["0","1"]}`, `l is a list of 2, want a list of 1`},
		{`{"s":{"0":{"enc":"aes","n":4096}},"l":["0"]}`, `s.0 lacks "salt"`},
	}
	for _, c := range cases {
		tree, err := parseStrictJSON([]byte(c.in))
		if err != nil {
			t.Fatal(err)
		}
		err = compareTree("", want, tree, true)
		if err == nil {
			err = compareTree("", want, tree, false)
		}
		if errString(err) != c.msg {
			t.Errorf("%s: %v, want %q", c.in, err, c.msg)
		}
	}
}

func TestParseSubsystem(t *testing.T) {
	field := func(s string) []byte { b := make([]byte, 48); copy(b, s); return b }
	for s, want := range map[string]uint32{"": 0, "latchkey-g1": 1, "latchkey-g42": 42, "latchkey-g2147483647": MaxKeyGeneration} {
		if got, err := ParseSubsystem(field(s)); err != nil || got != want {
			t.Errorf("%q: %d %v, want %d", s, got, err, want)
		}
		if SubsystemName(want) != s {
			t.Errorf("SubsystemName(%d) = %q, want %q", want, SubsystemName(want), s)
		}
	}
	junk := field("latchkey-g1")
	junk[40] = 'x' // text after the NUL
	for _, b := range [][]byte{field("latchkey-g"), field("latchkey-g-1"), field("latchkey-g+1"), field("latchkey-g1 "), field("LATCHKEY-G1"), junk} {
		if _, err := ParseSubsystem(b); err == nil {
			t.Errorf("%q accepted", b)
		}
	}
}
