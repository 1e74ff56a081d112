package policy

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/latchkey/latchkey/internal/logkey"
)

// StoreConfig configures a Store.
type StoreConfig struct {
	Path string
	Deps Deps
	// Interval between checks of the file (default 2s).
	Interval time.Duration
	Logger   *slog.Logger
	// OnReload is told of every reload attempt (for metrics); optional.
	OnReload func(digest string, err error)
}

// Store holds the snapshot in force and hot-reloads the policy file. A
// join reads the pointer once, so it is checked against one policy even if
// a reload lands mid-join; there is no lock on the join path.
type Store struct {
	cfg    StoreConfig
	cur    atomic.Pointer[Snapshot]
	digest string
	// bad is the digest of the last refused content ("unreadable: ..."
	// when the file could not be read), "" when the file is good; Run's
	// goroutine alone touches it.
	bad string
}

// NewStore loads the file; a bad initial file is an error, since there is
// no old policy to keep.
func NewStore(cfg StoreConfig) (*Store, error) {
	if cfg.Path == "" {
		return nil, errors.New("no policy file configured")
	}
	if cfg.Interval <= 0 {
		cfg.Interval = 2 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	s := &Store{cfg: cfg}
	data, err := ReadFile(cfg.Path)
	if err != nil {
		return nil, err
	}
	snap, err := Load(data, cfg.Deps)
	if err != nil {
		return nil, err
	}
	s.install(snap)
	return s, nil
}

// Current returns the snapshot in force.
func (s *Store) Current() *Snapshot { return s.cur.Load() }

func (s *Store) install(snap *Snapshot) {
	s.cur.Store(snap)
	s.digest = snap.Digest
}

// Run polls the file until ctx ends, reloading when its content changes.
func (s *Store) Run(ctx context.Context) {
	if s.cfg.Path == "" {
		return
	}
	t := time.NewTicker(s.cfg.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s.Reload()
		}
	}
}

// Reload checks the file once. Unchanged content is a no-op; a bad file is
// logged and the snapshot in force stays. A bad file is logged (and told
// to OnReload) once per distinct content, not at every poll, and the
// first good content after it is logged as a recovery, also when it is
// the policy in force again (a bad edit reverted).
func (s *Store) Reload() {
	data, err := ReadFile(s.cfg.Path)
	attempt := ""
	if err == nil {
		attempt = Digest(data)
	} else {
		attempt = "unreadable: " + err.Error()
	}
	if attempt == s.digest {
		if s.recovered(s.digest) {
			s.notify(s.digest, nil) // the file loads again: a successful reload
		}
		return
	}
	if attempt == s.bad {
		return // already logged and counted
	}
	var snap *Snapshot
	if err == nil {
		snap, err = Load(data, s.cfg.Deps)
	}
	if err != nil {
		s.bad = attempt
		s.cfg.Logger.Error("policy reload refused; the policy in force stays until the file is fixed",
			logkey.Path, s.cfg.Path, logkey.Policy, s.digest, logkey.Error, err)
		s.notify("", err)
		return
	}
	s.install(snap)
	if !s.recovered(snap.Digest) {
		s.cfg.Logger.Info("policy reloaded", logkey.Path, s.cfg.Path, logkey.Policy, snap.Digest)
	}
	s.notify(snap.Digest, nil)
}

// recovered logs the end of a run of bad files, if one was running, and
// reports whether it did.
func (s *Store) recovered(digest string) bool {
	if s.bad == "" {
		return false
	}
	s.bad = ""
	s.cfg.Logger.Info("policy file fixed; reloads resume", logkey.Path, s.cfg.Path, logkey.Policy, digest)
	return true
}

func (s *Store) notify(digest string, err error) {
	if s.cfg.OnReload != nil {
		s.cfg.OnReload(digest, err)
	}
}
