package binding

import (
	"errors"
	"fmt"
	"strings"
)

// Skipped records in a listing. A store's List reads every record it
// holds; one that does not parse or validate (an edited object, a number
// out of range, a file cut short) must not hide every other record from
// the callers that act on the listing: the deny-list sweep, `bindings
// list`, `tokens list|revoke`. So List returns the records it could read
// together with a *SkippedError naming each record it left out, and
// callers that can act on a partial listing separate the two with
// Skipped. A caller for which a missing record could be the one that
// matters (`secret retire`: the unreadable record may be a disk that still
// needs the generation) treats a non-empty skip list as a refusal.
//
// The type is store-independent: every Store implementation (Dir, Leases,
// and any other) reports its skipped records this way, each with its key
// in that store (file name, Lease name, etcd key) and the reason. A store
// in this package collects them with a skipList (add each record it
// cannot read, return skipList.err() with the rest); one elsewhere
// returns a *SkippedError itself. A record that is gone between the
// listing and its read is not skipped, just absent.

// SkippedRecord is one record a listing left out.
type SkippedRecord struct {
	// Key is the record's key in its store (file name, Lease name, etcd
	// key): what an operator inspects or deletes.
	Key string
	// Reason says why it could not be read.
	Reason string
}

// SkippedError is what List returns, next to the records it read, when
// it left records out. It never wraps a failure of the listing itself
// (the store unreachable): that is a plain error and no records.
type SkippedError struct {
	Records []SkippedRecord
}

func (e *SkippedError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "binding: %d unreadable record(s) skipped:", len(e.Records))
	for i, r := range e.Records {
		if i > 0 {
			b.WriteString(";")
		}
		fmt.Fprintf(&b, " %s: %s", r.Key, r.Reason)
	}
	return b.String()
}

// Skipped splits the error of a List into the records left out and any
// other error: a nil error gives (nil, nil), a *SkippedError (possibly
// wrapped) gives its records and nil, anything else gives (nil, err) and
// the listing must not be used.
func Skipped(err error) ([]SkippedRecord, error) {
	if err == nil {
		return nil, nil
	}
	var se *SkippedError
	if errors.As(err, &se) {
		return se.Records, nil
	}
	return nil, err
}

// skipList collects skipped records during a List.
type skipList []SkippedRecord

func (s *skipList) add(key string, err error) {
	*s = append(*s, SkippedRecord{Key: key, Reason: err.Error()})
}

// err is nil when nothing was skipped, else a *SkippedError.
func (s skipList) err() error {
	if len(s) == 0 {
		return nil
	}
	return &SkippedError{Records: s}
}
