package issuer

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/google/go-tpm/tpm2"
	"github.com/google/go-tpm/tpm2/transport"
	"google.golang.org/protobuf/proto"

	"github.com/latchkey/latchkey/attest"
	"github.com/latchkey/latchkey/attest/tpm/wire"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

// Config configures the agent's TPM evidence. The zero value quotes
// wire.DefaultPCRs on DefaultDevice.
type Config struct {
	// Device is a TPM path or "tcp://HOST:PORT" (see OpenDevice).
	Device string
	// PCRs are the SHA-256 PCR indices (0..23) to quote; empty means
	// wire.DefaultPCRs. Every PCR the event logs extend is quoted as well.
	PCRs []int
	// Logs are where the event logs and the PCR 11 signature are read
	// (zero value: the standard paths; a missing file sends none).
	Logs LogPaths
}

// Issuer makes TPM evidence on the agent. It opens the TPM once per
// attestation rather than holding it, so an attempt's objects live on its
// own connection (the kernel resource manager flushes them with it) and a
// swtpm, which serves one connection at a time, is free between attempts.
type Issuer struct {
	device string
	pcrs   []int
	logs   LogPaths
}

var _ attest.Issuer = (*Issuer)(nil)

// New checks cfg and that the TPM can be opened, so a misconfigured
// agent fails at start rather than at its first join.
func New(cfg Config) (*Issuer, error) {
	pcrs := slices.Clone(cfg.PCRs)
	if len(pcrs) == 0 {
		pcrs = slices.Clone(wire.DefaultPCRs)
	}
	if err := wire.CheckPCRs(pcrs); err != nil {
		return nil, fmt.Errorf("tpm issuer: %w", err)
	}
	slices.Sort(pcrs)
	c, err := open(cfg.Device)
	if err != nil {
		return nil, fmt.Errorf("tpm issuer: %w", err)
	}
	if err := c.Close(); err != nil {
		return nil, fmt.Errorf("tpm issuer: close probe: %w", err)
	}
	return &Issuer{device: cfg.Device, pcrs: pcrs, logs: cfg.Logs.withDefaults()}, nil
}

// Variant is VARIANT_TPM.
func (i *Issuer) Variant() latchkeyv1.Variant { return latchkeyv1.Variant_VARIANT_TPM }

// Close has nothing to release: every attestation owns its connection.
func (i *Issuer) Close() error { return nil }

// Attest opens the TPM, loads the EK and the AK, quotes the configured PCRs
// with binding as qualifying data and reads the EK certificate. The
// returned Attestation keeps the keys loaded to answer the credential
// challenge until Close; on any error everything created so far is
// flushed.
func (i *Issuer) Attest(ctx context.Context, binding []byte) (attest.Attestation, error) {
	if len(binding) != attest.BindingSize {
		return nil, fmt.Errorf("tpm attest: binding has %d bytes, want %d", len(binding), attest.BindingSize)
	}
	c, err := open(i.device)
	if err != nil {
		return nil, fmt.Errorf("tpm attest: %w: %w", ErrDevice, err)
	}
	a := &attestation{conn: c}
	stop := c.interruptible(ctx)
	err = a.make(i.pcrs, i.logs, binding)
	stop()
	if err != nil {
		return nil, errors.Join(fmt.Errorf("tpm attest: %w", deviceError(err)), a.Close())
	}
	return a, nil
}

// attestation is one attempt: its connection, its keys and the evidence
// they produced.
type attestation struct {
	mu       sync.Mutex
	conn     *tpmConn
	ek, ak   *key
	evidence []byte
	closed   bool
}

func (a *attestation) make(pcrs []int, paths LogPaths, binding []byte) error {
	var err error
	if a.ek, err = loadEK(a.conn); err != nil {
		return err
	}
	if a.ak, err = createAK(a.conn); err != nil {
		return err
	}
	ev := &latchkeyv1.TPMEvidence{AkPublic: a.ak.public, EkPublic: a.ek.public}
	if err := quoteWithLogs(a.conn, a.ak, pcrs, paths, binding, ev); err != nil {
		return err
	}
	if ev.EkCertificate, err = readEKCert(a.conn); err != nil {
		return err
	}
	a.evidence, err = proto.MarshalOptions{Deterministic: true}.Marshal(ev)
	if err != nil {
		return fmt.Errorf("marshal evidence: %w", err)
	}
	return nil
}

// Evidence is the serialized latchkeyv1.TPMEvidence.
func (a *attestation) Evidence() []byte { return slices.Clone(a.evidence) }

// Close flushes the AK and the EK and closes the connection; it reports
// every failure and is safe to call twice.
func (a *attestation) Close() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return nil
	}
	a.closed = true
	err := errors.Join(flush(a.conn, a.ak), flush(a.conn, a.ek), a.conn.Close())
	a.ak, a.ek = nil, nil
	if err != nil {
		return fmt.Errorf("tpm attestation close: %w", err)
	}
	return nil
}

// quoteWithLogs reads the logs, quotes pcrs and every PCR the logs touch,
// and reads the logs again: a measurement between the two readings (systemd
// appending a phase) would leave log and quote apart, so it starts over.
func quoteWithLogs(tp transport.TPM, ak *key, pcrs []int, paths LogPaths, binding []byte, ev *latchkeyv1.TPMEvidence) error {
	const attempts = 3
	for range attempts {
		before, err := readLogs(paths)
		if err != nil {
			return err
		}
		touched, err := touchedPCRs(before)
		if err != nil {
			return err
		}
		sel := slices.Clone(pcrs)
		for _, p := range touched {
			if !slices.Contains(sel, p) {
				sel = append(sel, p)
			}
		}
		slices.Sort(sel)
		if err := quote(tp, ak, sel, binding, ev); err != nil {
			return err
		}
		after, err := readLogs(paths)
		if err != nil {
			return err
		}
		if before.equal(after) {
			ev.FirmwareEventLog, ev.SystemdEventLog, ev.PcrSignature = before.fw, before.sd, before.sig
			return nil
		}
	}
	return fmt.Errorf("quote: event logs changed during %d quotes", attempts)
}

// quote signs pcrs and binding with the AK and fills ev with the quote,
// its signature and the PCR values. PCRs are read after quoting; if one
// changed in between (a measurement raced the quote), it quotes again.
func quote(tp transport.TPM, ak *key, pcrs []int, binding []byte, ev *latchkeyv1.TPMEvidence) error {
	const attempts = 3
	for range attempts {
		rsp, err := tpm2.Quote{
			SignHandle:     tpm2.AuthHandle{Handle: ak.handle, Name: ak.name, Auth: tpm2.PasswordAuth(nil)},
			QualifyingData: tpm2.TPM2BData{Buffer: binding},
			InScheme:       tpm2.TPMTSigScheme{Scheme: tpm2.TPMAlgNull},
			PCRSelect:      wire.Selection(pcrs),
		}.Execute(tp)
		if err != nil {
			return fmt.Errorf("quote: %w", err)
		}
		quoted, err := quotedDigest(&rsp.Quoted)
		if err != nil {
			return err
		}
		values, err := readPCRs(tp, pcrs)
		if err != nil {
			return err
		}
		if bytes.Equal(wire.PCRDigest(pcrs, values), quoted) {
			ev.Quote, ev.Signature, ev.Pcrs = rsp.Quoted.Bytes(), tpm2.Marshal(rsp.Signature), wirePCRs(values)
			return nil
		}
	}
	return fmt.Errorf("quote: pcrs changed during %d quotes", attempts)
}

func quotedDigest(quoted *tpm2.TPM2BAttest) ([]byte, error) {
	a, err := quoted.Contents()
	if err != nil {
		return nil, fmt.Errorf("parse quote: %w", err)
	}
	info, err := a.Attested.Quote()
	if err != nil {
		return nil, fmt.Errorf("parse quote: %w", err)
	}
	return info.PCRDigest.Buffer, nil
}

func wirePCRs(values map[int][]byte) map[uint32][]byte {
	out := make(map[uint32][]byte, len(values))
	for p, v := range values {
		out[uint32(p)] = v
	}
	return out
}
