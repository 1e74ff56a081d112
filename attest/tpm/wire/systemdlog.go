package wire

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
)

// SystemdEvent is one record of systemd's userspace measurement log,
// decoded but not verified: the agent reads which PCRs it touches, the
// verifier replays it.
type SystemdEvent struct {
	PCR     int
	Digest  [sha256.Size]byte
	Type    string // content.eventType
	Content string // content.string
}

// sdRecord is the JSON of one record as systemd (tpm2-util.c) writes it:
//
//	{"pcr":11,"digests":[{"hashAlg":"sha256","digest":"<hex>"}],
//	 "content_type":"systemd","content":{"string":"sysinit","eventType":"phase"}}
//
// Fields systemd may add later are ignored; the ones read are type-checked.
type sdRecord struct {
	PCR     *int `json:"pcr"`
	Digests []struct {
		HashAlg string `json:"hashAlg"`
		Digest  string `json:"digest"`
	} `json:"digests"`
	ContentType string `json:"content_type"`
	Content     struct {
		String    string `json:"string"`
		EventType string `json:"eventType"`
	} `json:"content"`
}

// recordSeparator starts every JSON-SEQ (RFC 7464) record.
const recordSeparator = 0x1e

// DecodeSystemdLog parses a tpm2-measure.log: JSON-SEQ records, each an
// RS byte, a JSON object and a newline. It checks the size limits, that
// every record names a PCR 0..23 and carries exactly one SHA-256 digest,
// and that there are at most MaxSystemdEvents records. A record cut short
// (systemd appends under a lock, but a crash can leave one) is an error:
// the verifier cannot tell a torn write from a forged one.
func DecodeSystemdLog(raw []byte) ([]SystemdEvent, error) {
	if len(raw) > MaxSystemdLogSize {
		return nil, fmt.Errorf("systemd event log has %d bytes, limit %d", len(raw), MaxSystemdLogSize)
	}
	var out []SystemdEvent
	rest := raw
	for len(bytes.TrimSpace(rest)) > 0 {
		if rest[0] != recordSeparator {
			return nil, fmt.Errorf("systemd event log record %d does not start with RS", len(out))
		}
		rest = rest[1:]
		end := bytes.IndexByte(rest, recordSeparator)
		if end < 0 {
			end = len(rest)
		}
		if len(out) == MaxSystemdEvents {
			return nil, fmt.Errorf("systemd event log has more than %d records", MaxSystemdEvents)
		}
		ev, err := decodeSystemdRecord(rest[:end])
		if err != nil {
			return nil, fmt.Errorf("systemd event log record %d: %w", len(out), err)
		}
		out = append(out, ev)
		rest = rest[end:]
	}
	return out, nil
}

func decodeSystemdRecord(b []byte) (SystemdEvent, error) {
	var r sdRecord
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(&r); err != nil {
		return SystemdEvent{}, fmt.Errorf("parse: %w", err)
	}
	if dec.More() {
		return SystemdEvent{}, errors.New("text after the json object")
	}
	if r.PCR == nil || *r.PCR < 0 || *r.PCR > MaxPCR {
		return SystemdEvent{}, errors.New("no pcr 0..23")
	}
	ev := SystemdEvent{PCR: *r.PCR, Type: r.Content.EventType, Content: r.Content.String}
	found := false
	for _, d := range r.Digests {
		if d.HashAlg != "sha256" {
			continue
		}
		raw, err := hex.DecodeString(d.Digest)
		if found || err != nil || len(raw) != sha256.Size {
			return SystemdEvent{}, errors.New("sha256 digest missing, repeated or not 64 hex digits")
		}
		ev.Digest, found = [sha256.Size]byte(raw), true
	}
	if !found {
		return SystemdEvent{}, errors.New("no sha256 digest")
	}
	return ev, nil
}
