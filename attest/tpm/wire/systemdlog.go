package tpm

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
)

// sdEvent is one record of systemd's userspace measurement log, decoded but
// not verified.
type sdEvent struct {
	pcr     int
	digest  [sha256.Size]byte
	typ     string // content.eventType
	content string // content.string
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

// decodeSystemdLog parses a tpm2-measure.log: JSON-SEQ records, each an
// RS byte, a JSON object and a newline. It checks the size limits, that
// every record names a PCR 0..23 and carries exactly one SHA-256 digest,
// and that there are at most maxSystemdEvents records. A record cut short
// (systemd appends under a lock, but a crash can leave one) is an error:
// the verifier cannot tell a torn write from a forged one.
func decodeSystemdLog(raw []byte) ([]sdEvent, error) {
	if len(raw) > MaxSystemdLogSize {
		return nil, fmt.Errorf("systemd event log has %d bytes, limit %d", len(raw), MaxSystemdLogSize)
	}
	var out []sdEvent
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
		if len(out) == maxSystemdEvents {
			return nil, fmt.Errorf("systemd event log has more than %d records", maxSystemdEvents)
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

func decodeSystemdRecord(b []byte) (sdEvent, error) {
	var r sdRecord
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(&r); err != nil {
		return sdEvent{}, fmt.Errorf("parse: %w", err)
	}
	if dec.More() {
		return sdEvent{}, errors.New("text after the json object")
	}
	if r.PCR == nil || *r.PCR < 0 || *r.PCR > maxPCR {
		return sdEvent{}, errors.New("no pcr 0..23")
	}
	ev := sdEvent{pcr: *r.PCR, typ: r.Content.EventType, content: r.Content.String}
	found := false
	for _, d := range r.Digests {
		if d.HashAlg != "sha256" {
			continue
		}
		raw, err := hex.DecodeString(d.Digest)
		if found || err != nil || len(raw) != sha256.Size {
			return sdEvent{}, errors.New("sha256 digest missing, repeated or not 64 hex digits")
		}
		ev.digest, found = [sha256.Size]byte(raw), true
	}
	if !found {
		return sdEvent{}, errors.New("no sha256 digest")
	}
	return ev, nil
}
