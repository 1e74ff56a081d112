package config

import (
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/latchkey/latchkey/agent/join"
	"github.com/latchkey/latchkey/protocol"
)

// DefaultVerifierPort is the port of a verifier address given without one
// (the verifier's default listen address is :7443).
const DefaultVerifierPort = "7443"

// validateLocal refuses, before any network, what the verifier would
// refuse anyway or what would only show as a retry loop: each message
// says which setting to fix. It normalises verifier addresses (adds the
// default port).
func (c *Config) validateLocal() error {
	for i, v := range c.Verifiers {
		addr, err := normaliseVerifier(v)
		if err != nil {
			return err
		}
		c.Verifiers[i] = addr
	}
	if err := validNodeName(c.NodeName); err != nil {
		return err
	}
	if c.Timeout.Duration < 0 {
		return fmt.Errorf("timeout %s is negative: give a positive duration such as 10m (timeout:, --timeout)", c.Timeout.Duration)
	}
	if d := c.Offline.After.Duration; d < time.Second {
		return fmt.Errorf("offline.after %s is below 1s: give how long to try the verifiers before an offline unlock, such as 1m", d)
	}
	if d := c.Reattest.Interval.Duration; d < time.Second && !c.Reattest.Disabled {
		return fmt.Errorf("reattest.interval %s is below 1s (to turn re-attestation off, set reattest.disabled: true)", d)
	}
	if b := c.Disk.BlankCheck; b != "" && b != "full" && b != "sampled" {
		return fmt.Errorf("disk.blankCheck %q: want full (the default: read every byte before a first boot formats) or sampled", b)
	}
	if c.Disk.WaitTimeout.Duration < 0 {
		return fmt.Errorf("disk.waitTimeout %s is negative", c.Disk.WaitTimeout.Duration)
	}
	if err := c.Join.validateCRI(); err != nil {
		return err
	}
	if c.StatusFile != "-" && !filepath.IsAbs(c.StatusFile) {
		return fmt.Errorf("statusFile %q is not an absolute path (or \"-\" to keep no last result)", c.StatusFile)
	}
	return c.validateDiskUUID()
}

// normaliseVerifier accepts host:port, [v6]:port, or a host alone (the
// default port is added); a URL is refused, since the agent speaks gRPC
// over its own attested TLS, not HTTPS.
func normaliseVerifier(v string) (string, error) {
	if strings.Contains(v, "://") {
		return "", fmt.Errorf("verifier %q: give host:port without a scheme (e.g. %q)", v, stripScheme(v))
	}
	if strings.ContainsAny(v, "/ ") || v == "" {
		return "", fmt.Errorf("verifier %q: want host:port", v)
	}
	host, port, err := net.SplitHostPort(v)
	if err != nil {
		if strings.Count(v, ":") > 1 && !strings.HasPrefix(v, "[") {
			return "", fmt.Errorf("verifier %q: write an IPv6 address as [addr]:port", v)
		}
		host, port = strings.Trim(v, "[]"), DefaultVerifierPort
	}
	if host == "" {
		return "", fmt.Errorf("verifier %q: no host", v)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return "", fmt.Errorf("verifier %q: port %q is not a number from 1 to 65535", v, port)
	}
	return net.JoinHostPort(host, port), nil
}

func stripScheme(v string) string {
	_, rest, _ := strings.Cut(v, "://")
	rest, _, _ = strings.Cut(rest, "/")
	return rest
}

func validNodeName(n string) error {
	// Kubernetes' rule for object names, and so for node names:
	// lower-case alphanumerics, '-' and '.', at most 253 characters, each
	// dot-separated label starting and ending alphanumeric.
	if !join.ValidNodeName(n) {
		return fmt.Errorf("node name %q is not a valid Kubernetes node name (lower-case letters, digits, '-' and '.'; "+
			"at most 253 characters): set nodeName: or --node-name", n)
	}
	return nil
}

func (c *Config) validateDiskUUID() error {
	switch {
	case c.Disk.Mode == "key-only" && c.Disk.UUID == "":
		return errors.New("disk mode key-only needs the disk's UUID (disk.uuid:, --disk-uuid)")
	case c.Disk.UUID != "" && !protocol.ValidDiskUUID(c.Disk.UUID):
		return fmt.Errorf("disk uuid %q is not a canonical lower-case UUID (like 3f2a9c1e-5b7d-4e8f-9a0b-1c2d3e4f5a6b)", c.Disk.UUID)
	}
	return nil
}

// validateCRI accepts an empty join.criSocket (kubeadm detects the
// runtime) or unix:///absolute/path, and a non-negative join.criWait.
func (j *Join) validateCRI() error {
	if j.CRIWait.Duration < 0 {
		return fmt.Errorf("join.criWait %s is negative", j.CRIWait.Duration)
	}
	if j.CRISocket == "" {
		return nil
	}
	p, ok := strings.CutPrefix(j.CRISocket, "unix://")
	if !ok || !filepath.IsAbs(p) || filepath.Clean(p) != p {
		return fmt.Errorf("join.criSocket %q: want unix:///absolute/path (e.g. unix:///run/containerd/containerd.sock)", j.CRISocket)
	}
	return nil
}
