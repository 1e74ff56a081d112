package binding

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/latchkey/latchkey/internal/atomicfile"
	"github.com/latchkey/latchkey/internal/logkey"
)

// maxRecordFile bounds a record file read back from disk.
const maxRecordFile = 4 << 10

// DirConfig configures a directory store.
type DirConfig struct {
	// Dir holds one file per record; it is created (0700) when missing.
	Dir string
	// Now is the clock (default time.Now).
	Now    func() time.Time
	Logger *slog.Logger
}

// Dir is the disk-only store: one JSON file per record in a directory of
// the verifier's state directory, mode 0600. A record is written in full
// to a temporary file, synced, and then linked to its name with link(2),
// which fails when the name exists: creation is atomic and
// create-if-absent, and a crash leaves either no record or a whole one.
//
// Dir serialises updates of one record within one process (a lock per
// record name, striped, so joins of different machines do not wait for
// each other's fsync). It is meant for one
// verifier replica: two processes sharing the directory never both win a
// claim (link is atomic), but a release racing another process's token
// update is not serialised. Run Kubernetes mode (Leases) for several
// replicas.
type Dir struct {
	dir   string
	now   func() time.Time
	log   *slog.Logger
	locks [64]sync.Mutex
}

// lock returns the mutex guarding the record file name.
func (d *Dir) lock(name string) *sync.Mutex {
	h := fnv.New32a()
	h.Write([]byte(name))
	return &d.locks[h.Sum32()%uint32(len(d.locks))]
}

var _ Store = (*Dir)(nil)

// NewDir creates the directory if needed.
func NewDir(cfg DirConfig) (*Dir, error) {
	if cfg.Dir == "" {
		return nil, errors.New("binding: no directory")
	}
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("binding: %w", err)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Dir{dir: cfg.Dir, now: cfg.Now, log: cfg.Logger.With(logkey.Component, "binding")}, nil
}

// fileRecord is a record's file content.
type fileRecord struct {
	Kind     Kind   `json:"kind"`
	Name     string `json:"name"`
	Identity string `json:"identity"`
	TokenID  string `json:"tokenID,omitempty"`
	// Dir records no token times (disk-only mode mints no tokens).
	TokenRecorded time.Time `json:"tokenRecorded,omitzero"`
	TokenExpiry   time.Time `json:"tokenExpiry,omitzero"`
	Created       time.Time `json:"created"`
	Released      time.Time `json:"released,omitzero"`
	ReleasedBy    string    `json:"releasedBy,omitempty"`
	// KeyGeneration: see Record.
	KeyGeneration *uint32 `json:"keyGeneration,omitempty"`
}

func (d *Dir) path(kind Kind, name string) string {
	return filepath.Join(d.dir, ObjectName(kind, name))
}

// Claim implements Store.
func (d *Dir) Claim(ctx context.Context, kind Kind, name, identity string) (Record, error) {
	r, _, err := d.claim(kind, name, identity, nil)
	return r, err
}

// claim is Claim, recording gen (when non-nil) on a record it creates
// or takes over; made reports it did either.
func (d *Dir) claim(kind Kind, name, identity string, gen *uint32) (Record, bool, error) {
	if err := validate(kind, name, identity, true); err != nil {
		return Record{}, false, err
	}
	mu := d.lock(ObjectName(kind, name))
	mu.Lock()
	defer mu.Unlock()
	r := Record{Kind: kind, Name: name, Identity: identity, Created: d.now().UTC().Truncate(time.Second), KeyGeneration: gen}
	err := d.create(d.path(kind, name), r)
	if errors.Is(err, fs.ErrExist) {
		have, gerr := d.read(d.path(kind, name))
		if gerr != nil {
			return Record{}, false, gerr
		}
		if have.Bound() {
			return have, false, Check(have, identity)
		}
		// Released: the next claim takes it over (the disk is still
		// keyed under the generation on record, unless this claim
		// records its own).
		if gen == nil {
			r.KeyGeneration = have.KeyGeneration
		}
		err = d.replace(d.path(kind, name), r)
	}
	if err != nil {
		return Record{}, false, err
	}
	d.log.Info("binding claimed", logkey.Kind, string(kind), logkey.Name, name, logkey.Identity, identity)
	return r, true, nil
}

// Get implements Store.
func (d *Dir) Get(_ context.Context, kind Kind, name string) (Record, error) {
	if err := validate(kind, name, "", false); err != nil {
		return Record{}, err
	}
	return d.read(d.path(kind, name))
}

// SetToken implements Store.
func (d *Dir) SetToken(_ context.Context, node, identity, tokenID string) error {
	if err := validate(Node, node, identity, true); err != nil {
		return err
	}
	return d.update(Node, node, func(r Record) (*Record, error) {
		if err := Check(r, identity); err != nil {
			return nil, err
		}
		r.TokenID = tokenID
		return &r, nil
	})
}

// update is the read-modify-write of one record under its lock, the one
// way Dir changes a record it has: change gets the record as stored and
// returns the record to store in its place, nil to store nothing, or an
// error, which update returns.
func (d *Dir) update(kind Kind, name string, change func(Record) (*Record, error)) error {
	mu := d.lock(ObjectName(kind, name))
	mu.Lock()
	defer mu.Unlock()
	p := d.path(kind, name)
	r, err := d.read(p)
	if err != nil {
		return err
	}
	next, err := change(r)
	if err != nil || next == nil {
		return err
	}
	return d.replace(p, *next)
}

// Release implements Store.
func (d *Dir) Release(_ context.Context, kind Kind, name, by string) (Record, error) {
	if err := validate(kind, name, "", false); err != nil {
		return Record{}, err
	}
	var was Record
	err := d.update(kind, name, release(kind, name, by, d.now(), &was))
	if err != nil {
		return Record{}, err
	}
	d.log.Warn("binding released", logkey.Kind, string(kind), logkey.Name, name, logkey.Identity, was.Identity, logkey.By, by)
	return was, nil
}

// release is Release's change, for the stores that keep Records (Dir,
// Etcd): a bound record becomes a tombstone that keeps its creation time
// and the disk's key generation (`secret retire` still sees it), and the
// record as it was is left in was for the audit line.
func release(kind Kind, name, by string, now time.Time, was *Record) func(Record) (*Record, error) {
	return func(r Record) (*Record, error) {
		if !r.Bound() {
			return nil, fmt.Errorf("%w: %s %s was already released", ErrNotFound, kind, name)
		}
		*was = r
		return &Record{Kind: kind, Name: name, Created: r.Created, Released: now.UTC().Truncate(time.Second), ReleasedBy: by,
			KeyGeneration: r.KeyGeneration}, nil
	}
}

// List implements Store; an unreadable file is skipped and reported
// (*SkippedError).
func (d *Dir) List(_ context.Context) ([]Record, error) {
	entries, err := os.ReadDir(d.dir)
	if err != nil {
		return nil, fmt.Errorf("binding: %w", err)
	}
	var out []Record
	var skipped skipList
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".") || !e.Type().IsRegular() {
			continue
		}
		r, err := d.read(filepath.Join(d.dir, e.Name()))
		if errors.Is(err, ErrNotFound) {
			continue // removed since ReadDir
		}
		if err != nil {
			skipped.add(e.Name(), err)
			continue
		}
		out = append(out, r)
	}
	return out, skipped.err()
}

// create writes r to p unless p exists (fs.ErrExist), atomically.
func (d *Dir) create(p string, r Record) error {
	data, err := json.Marshal(fileRecord(r))
	if err != nil {
		return err
	}
	if err := atomicfile.Create(p, data, 0o600); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return fs.ErrExist
		}
		return fmt.Errorf("binding: %w", err)
	}
	return nil
}

// replace writes r over p atomically.
func (d *Dir) replace(p string, r Record) error {
	data, err := json.Marshal(fileRecord(r))
	if err != nil {
		return err
	}
	if err := atomicfile.Write(p, data, 0o600); err != nil {
		return fmt.Errorf("binding: %w", err)
	}
	return nil
}

func (d *Dir) read(p string) (Record, error) {
	f, err := os.Open(p)
	if errors.Is(err, fs.ErrNotExist) {
		kind, name, _ := strings.Cut(filepath.Base(p), "-")
		return Record{}, fmt.Errorf("%w: %s %s", ErrNotFound, kind, name)
	}
	if err != nil {
		return Record{}, fmt.Errorf("binding: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxRecordFile+1))
	if err != nil {
		return Record{}, fmt.Errorf("binding: read %s: %w", p, err)
	}
	if len(data) > maxRecordFile {
		return Record{}, fmt.Errorf("binding: record %s is over %d bytes", p, maxRecordFile)
	}
	var fr fileRecord
	if err := json.Unmarshal(data, &fr); err != nil {
		return Record{}, fmt.Errorf("binding: record %s: %w", p, err)
	}
	if !validRecord(Record(fr)) || ObjectName(fr.Kind, fr.Name) != filepath.Base(p) {
		return Record{}, fmt.Errorf("binding: record %s does not name itself", p)
	}
	return Record(fr), nil
}
