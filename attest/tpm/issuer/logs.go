package issuer

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"slices"

	"github.com/google/go-eventlog/register"
	"github.com/google/go-eventlog/tcg"

	"github.com/latchkey/latchkey/attest/tpm/wire"
)

// Where the agent finds the logs on a booted machine.
const (
	// DefaultFirmwareLog is the kernel's copy of the firmware TCG log.
	DefaultFirmwareLog = "/sys/kernel/security/tpm0/binary_bios_measurements"
	// DefaultSystemdLog is systemd's userspace measurement log (systemd
	// 254 and newer; Debian 12's systemd 252 writes none).
	DefaultSystemdLog = "/run/log/systemd/tpm2-measure.log"
	// DefaultPCRSignature is where systemd-tmpfiles copies the UKI's
	// .pcrsig, which systemd-stub hands to the initrd as
	// /.extra/tpm2-pcr-signature.json (systemd 252's tmpfiles.d/systemd.conf
	// does this on Debian 12).
	DefaultPCRSignature = "/run/systemd/tpm2-pcr-signature.json"
	// NoLog as a path sends no such log.
	NoLog = "-"
)

// LogPaths says where the issuer reads the logs. Empty fields are the
// defaults; NoLog ("-") disables one.
type LogPaths struct {
	FirmwareEventLog string
	SystemdEventLog  string
	PCRSignature     string
}

func (p LogPaths) withDefaults() LogPaths {
	def := func(s, d string) string {
		if s == "" {
			return d
		}
		return s
	}
	return LogPaths{
		FirmwareEventLog: def(p.FirmwareEventLog, DefaultFirmwareLog),
		SystemdEventLog:  def(p.SystemdEventLog, DefaultSystemdLog),
		PCRSignature:     def(p.PCRSignature, DefaultPCRSignature),
	}
}

// logs are the bytes of one reading of the three files.
type logs struct {
	fw, sd, sig []byte
}

func (l logs) equal(o logs) bool {
	return bytes.Equal(l.fw, o.fw) && bytes.Equal(l.sd, o.sd) && bytes.Equal(l.sig, o.sig)
}

// readLogs reads the files that exist, each bounded by its evidence limit:
// a file over it is an error, since sending part of a log would only make
// the verifier refuse it.
func readLogs(p LogPaths) (logs, error) {
	var l logs
	var err error
	if l.fw, err = readBounded(p.FirmwareEventLog, wire.MaxFirmwareLogSize); err != nil {
		return logs{}, err
	}
	if len(l.fw) == 0 {
		return logs{}, nil // a systemd log cannot be replayed without it
	}
	if l.sd, err = readBounded(p.SystemdEventLog, wire.MaxSystemdLogSize); err != nil {
		return logs{}, err
	}
	if l.sig, err = readBounded(p.PCRSignature, wire.MaxPCRSignatureSize); err != nil {
		return logs{}, err
	}
	return l, nil
}

func readBounded(path string, limit int) ([]byte, error) {
	if path == NoLog {
		return nil, nil
	}
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, int64(limit)+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	if len(b) > limit {
		return nil, fmt.Errorf("%s is larger than the %d-byte evidence limit (set its path to %q to send none)", path, limit, NoLog)
	}
	return b, nil
}

// touchedPCRs lists the PCRs the logs extend, so the quote covers every
// one (the verifier refuses a log touching an unquoted PCR).
func touchedPCRs(l logs) ([]int, error) {
	var out []int
	if len(l.fw) > 0 {
		el, err := tcg.ParseEventLog(l.fw, tcg.ParseOpts{})
		if err != nil {
			return nil, fmt.Errorf("firmware event log: %w", err)
		}
		for _, e := range el.Events(register.HashSHA256) {
			if e.Type != tcg.NoAction && e.Index >= 0 && e.Index <= wire.MaxPCR && !slices.Contains(out, e.Index) {
				out = append(out, e.Index)
			}
		}
	}
	if len(l.sd) > 0 {
		sd, err := wire.DecodeSystemdLog(l.sd)
		if err != nil {
			return nil, err
		}
		for _, e := range sd {
			if !slices.Contains(out, e.PCR) {
				out = append(out, e.PCR)
			}
		}
	}
	return out, nil
}
