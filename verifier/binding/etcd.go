package binding

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/latchkey/latchkey/attest"
	"github.com/latchkey/latchkey/internal/logkey"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

// The etcd store: disk-only verifier replicas share their records through
// an etcd v3 cluster (docs/replicas.md). Every decision that a release
// could change reads linearizably (a read served by the leader's quorum),
// so no replica decides on a stale copy; a claim creates its key only if
// absent, in one transaction; every other change is a compare-and-swap on
// the key's ModRevision. When etcd has no quorum nothing is decided: the
// join is refused UNAVAILABLE with EtcdUnavailableDetail and the agent
// retries.

// Defaults of EtcdConfig.
const (
	DefaultEtcdPrefix         = "/latchkey/"
	DefaultEtcdRequestTimeout = 5 * time.Second
	// EtcdRetryAfter is the retry hint of a join refused because etcd
	// cannot be reached: about one etcd leader election and a reconnect.
	EtcdRetryAfter = 5 * time.Second
)

// EtcdUnavailableDetail is the fixed refusal detail of a join refused
// because the etcd store cannot answer (no quorum, no member reachable,
// a request timed out): the join was not decided. A retry is safe: a
// claim that timed out after etcd committed it names this machine, and
// its retry finds it so.
const EtcdUnavailableDetail = "the identity store (etcd) has no quorum or cannot be reached; nothing was decided, retry later"

// Store operations, the op label of the store metrics (a closed set).
const (
	OpGet     = "get"
	OpClaim   = "claim"
	OpUpdate  = "update"
	OpRelease = "release"
	OpList    = "list"
	OpImport  = "import"
	OpCheck   = "check"
)

// maxEtcdAttempts bounds the compare-and-swap retries of one change; a
// record that changes this often under one change is contended by a
// runaway writer, and the change fails instead of spinning.
const maxEtcdAttempts = 8

// etcdListPage is how many records one list request reads.
const etcdListPage = 500

// etcdSchema is the version of the record format; a record of another
// version is refused, never guessed at.
const etcdSchema = 1

// EtcdConfig configures the etcd store.
type EtcdConfig struct {
	// Endpoints are the members' client URLs (https://host:port, or
	// http:// on loopback with Insecure).
	Endpoints []string
	// CAFile, CertFile and KeyFile are the CA that signs etcd's serving
	// certificates and the verifier's client certificate and key (PEM).
	// All three are required unless Insecure.
	CAFile, CertFile, KeyFile string
	// Insecure allows plain HTTP without client certificates (a loopback
	// test cluster only; the configuration refuses anything else).
	Insecure bool
	// Prefix is prepended to every key (default DefaultEtcdPrefix), so
	// several deployments can share one etcd.
	Prefix string
	// RequestTimeout bounds each request (default
	// DefaultEtcdRequestTimeout).
	RequestTimeout time.Duration
	// Now is the clock (default time.Now).
	Now    func() time.Time
	Logger *slog.Logger
	// Observe, if set, is told every request's operation (an Op
	// constant), duration and error (for the store metrics).
	Observe func(op string, d time.Duration, err error)
}

// Etcd is the store of disk-only replicas: one JSON record per key under
// Prefix + "bindings/" in an etcd v3 cluster.
type Etcd struct {
	cli     *clientv3.Client
	prefix  string
	timeout time.Duration
	now     func() time.Time
	log     *slog.Logger
	observe func(op string, d time.Duration, err error)
	// endpoints and tls (nil when insecure) are kept for Check's
	// diagnosis.
	endpoints []string
	tls       *tls.Config
	// beforeSwap, when set (tests), runs between the read and the
	// compare-and-swap of an update.
	beforeSwap func()
}

var (
	_ Store              = (*Etcd)(nil)
	_ GenerationRecorder = (*Etcd)(nil)
	_ GenerationClaimer  = (*Etcd)(nil)
)

// NewEtcd connects to etcd (lazily: the first request dials).
func NewEtcd(cfg EtcdConfig) (*Etcd, error) {
	if len(cfg.Endpoints) == 0 {
		return nil, errors.New("binding: etcd: no endpoints")
	}
	if cfg.Prefix == "" {
		cfg.Prefix = DefaultEtcdPrefix
	}
	if cfg.RequestTimeout <= 0 {
		cfg.RequestTimeout = DefaultEtcdRequestTimeout
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	cc := clientv3.Config{Endpoints: cfg.Endpoints, DialTimeout: cfg.RequestTimeout, Logger: zap.NewNop(),
		DialKeepAliveTime: 10 * time.Second, DialKeepAliveTimeout: cfg.RequestTimeout}
	if !cfg.Insecure {
		tc, err := transport.TLSInfo{CertFile: cfg.CertFile, KeyFile: cfg.KeyFile, TrustedCAFile: cfg.CAFile}.ClientConfig()
		if err != nil {
			return nil, fmt.Errorf("binding: etcd client TLS: %w", err)
		}
		cc.TLS = tc
	}
	cli, err := clientv3.New(cc)
	if err != nil {
		return nil, fmt.Errorf("binding: etcd: %w", err)
	}
	return &Etcd{cli: cli, prefix: cfg.Prefix + "bindings/", timeout: cfg.RequestTimeout, now: cfg.Now,
		log: cfg.Logger.With(logkey.Component, "binding"), observe: cfg.Observe, endpoints: cfg.Endpoints, tls: cc.TLS}, nil
}

// Close closes the connection to etcd.
func (e *Etcd) Close() error { return e.cli.Close() }

// Key is the etcd key of a record.
func (e *Etcd) Key(kind Kind, name string) string { return e.prefix + ObjectName(kind, name) }

// EtcdUnavailableError is a request etcd did not answer; the store
// returns it inside an UNAVAILABLE *attest.Refusal.
type EtcdUnavailableError struct {
	Op, Key string
	Err     error
}

func (e *EtcdUnavailableError) Error() string {
	return fmt.Sprintf("etcd %s %s: %v", e.Op, e.Key, e.Err)
}

func (e *EtcdUnavailableError) Unwrap() error { return e.Err }

// RetryAfter is the hint for the refused agent.
func (e *EtcdUnavailableError) RetryAfter() time.Duration { return EtcdRetryAfter }

// do runs one request under the request timeout, observes it, and turns
// a failure into the UNAVAILABLE refusal.
func (e *Etcd) do(ctx context.Context, op, key string, req func(ctx context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, e.timeout)
	defer cancel()
	start := time.Now()
	err := req(ctx)
	if e.observe != nil {
		e.observe(op, time.Since(start), err)
	}
	if err == nil {
		return nil
	}
	e.log.Warn("etcd request failed", logkey.Method, op, logkey.Path, key, logkey.Error, err.Error())
	return &attest.Refusal{Reason: latchkeyv1.Reason_UNAVAILABLE, Detail: EtcdUnavailableDetail,
		Err: &EtcdUnavailableError{Op: op, Key: key, Err: err}}
}

// get reads key linearizably: the record and its ModRevision, or
// ErrNotFound.
func (e *Etcd) get(ctx context.Context, kind Kind, name string) (Record, int64, error) {
	key := e.Key(kind, name)
	var resp *clientv3.GetResponse
	err := e.do(ctx, OpGet, key, func(ctx context.Context) (err error) {
		resp, err = e.cli.Get(ctx, key)
		return err
	})
	if err != nil {
		return Record{}, 0, err
	}
	if len(resp.Kvs) == 0 {
		return Record{}, 0, fmt.Errorf("%w: %s %s", ErrNotFound, kind, name)
	}
	r, err := e.decodeEtcd(key, resp.Kvs[0].Value)
	return r, resp.Kvs[0].ModRevision, err
}

// Get implements Store.
func (e *Etcd) Get(ctx context.Context, kind Kind, name string) (Record, error) {
	if err := validate(kind, name, "", false); err != nil {
		return Record{}, err
	}
	r, _, err := e.get(ctx, kind, name)
	return r, err
}

// Claim implements Store.
func (e *Etcd) Claim(ctx context.Context, kind Kind, name, identity string) (Record, error) {
	r, _, err := e.claim(ctx, kind, name, identity, nil)
	return r, err
}

// ClaimGeneration implements GenerationClaimer.
func (e *Etcd) ClaimGeneration(ctx context.Context, disk, identity string, gen uint32) (Record, bool, error) {
	return e.claim(ctx, Disk, disk, identity, &gen)
}

// claim creates the record in one transaction when the key is absent
// (CreateRevision == 0), or takes a released record over with a
// compare-and-swap on its ModRevision; a record bound to identity is
// returned as it is (made false), one bound to another identity is a
// *MismatchError.
func (e *Etcd) claim(ctx context.Context, kind Kind, name, identity string, gen *uint32) (Record, bool, error) {
	if err := validate(kind, name, identity, true); err != nil {
		return Record{}, false, err
	}
	if err := checkGenerationPtr(gen); err != nil {
		return Record{}, false, err
	}
	key := e.Key(kind, name)
	r := Record{Kind: kind, Name: name, Identity: identity, Created: e.now().UTC().Truncate(time.Second), KeyGeneration: gen}
	var rev int64 // 0: create-if-absent; else the released record's ModRevision
	for range maxEtcdAttempts {
		val, err := encodeEtcd(r)
		if err != nil {
			return Record{}, false, err
		}
		cmp := clientv3.Compare(clientv3.CreateRevision(key), "=", 0)
		if rev != 0 {
			cmp = clientv3.Compare(clientv3.ModRevision(key), "=", rev)
		}
		var resp *clientv3.TxnResponse
		err = e.do(ctx, OpClaim, key, func(ctx context.Context) (err error) {
			resp, err = e.cli.Txn(ctx).If(cmp).Then(clientv3.OpPut(key, val)).Else(clientv3.OpGet(key)).Commit()
			return err
		})
		if err != nil {
			return Record{}, false, err
		}
		if resp.Succeeded {
			e.log.Info("binding claimed", logkey.Kind, string(kind), logkey.Name, name, logkey.Identity, identity)
			return r, true, nil
		}
		kvs := resp.Responses[0].GetResponseRange().GetKvs()
		if len(kvs) == 0 { // deleted meanwhile: create it
			rev = 0
			continue
		}
		have, err := e.decodeEtcd(key, kvs[0].Value)
		if err != nil {
			return Record{}, false, err
		}
		if have.Bound() {
			return have, false, Check(have, identity)
		}
		// Released: the claim takes it over; the disk is still keyed under
		// the generation on record unless this claim records its own.
		rev = kvs[0].ModRevision
		if gen == nil {
			r.KeyGeneration = have.KeyGeneration
		}
	}
	return Record{}, false, fmt.Errorf("binding: etcd record %s changed %d times during one claim", key, maxEtcdAttempts)
}

// update is the read-modify-write of one record: change gets the record
// as read linearizably and returns the record to store in its place, nil
// to store nothing, or an error, which update returns. The write is a
// compare-and-swap on the ModRevision read; when another write came
// between, update reads again and calls change again, so change always
// decides on the current record.
func (e *Etcd) update(ctx context.Context, op string, kind Kind, name string, change func(Record) (*Record, error)) error {
	key := e.Key(kind, name)
	for range maxEtcdAttempts {
		r, rev, err := e.get(ctx, kind, name)
		if err != nil {
			return err
		}
		next, err := change(r)
		if err != nil || next == nil {
			return err
		}
		ok, err := e.swap(ctx, op, key, rev, *next)
		if err != nil || ok {
			return err
		}
	}
	return fmt.Errorf("binding: etcd record %s changed %d times during one update", key, maxEtcdAttempts)
}

// swap writes r at key if the key's ModRevision is still rev; ok is false
// when it is not (the record changed since it was read).
func (e *Etcd) swap(ctx context.Context, op, key string, rev int64, r Record) (ok bool, err error) {
	val, err := encodeEtcd(r)
	if err != nil {
		return false, err
	}
	if e.beforeSwap != nil {
		e.beforeSwap()
	}
	var resp *clientv3.TxnResponse
	err = e.do(ctx, op, key, func(ctx context.Context) (err error) {
		resp, err = e.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", rev)).
			Then(clientv3.OpPut(key, val)).Commit()
		return err
	})
	if err != nil {
		return false, err
	}
	return resp.Succeeded, nil
}

// SetToken implements Store.
func (e *Etcd) SetToken(ctx context.Context, node, identity, tokenID string) error {
	if err := validate(Node, node, identity, true); err != nil {
		return err
	}
	return e.update(ctx, OpUpdate, Node, node, func(r Record) (*Record, error) {
		if !r.Bound() {
			return nil, fmt.Errorf("%w: node %s was released", ErrNotFound, node)
		}
		if err := Check(r, identity); err != nil {
			return nil, err
		}
		if r.TokenID == tokenID {
			return nil, nil
		}
		r.TokenID = tokenID
		return &r, nil
	})
}

// SetKeyGeneration implements GenerationRecorder.
func (e *Etcd) SetKeyGeneration(ctx context.Context, disk, identity string, gen uint32) error {
	change, err := setGeneration(disk, identity, gen)
	if err != nil {
		return err
	}
	return e.update(ctx, OpUpdate, Disk, disk, change)
}

// Release implements Store. The record is not deleted: it stays as a
// tombstone (no identity, the time and who released it, the disk's key
// generation), and the release is logged, so the audit trail and `secret
// retire` still see it.
func (e *Etcd) Release(ctx context.Context, kind Kind, name, by string) (Record, error) {
	if err := validate(kind, name, "", false); err != nil {
		return Record{}, err
	}
	var was Record
	err := e.update(ctx, OpRelease, kind, name, release(kind, name, by, e.now(), &was))
	if err != nil {
		return Record{}, err
	}
	e.log.Warn("binding released", logkey.Kind, string(kind), logkey.Name, name, logkey.Identity, was.Identity, logkey.By, by,
		logkey.Path, e.Key(kind, name))
	return was, nil
}

// List implements Store: every record under the prefix, read in pages
// at one revision (a consistent snapshot). A record that is not valid is
// skipped and reported in a *SkippedError returned with the valid
// records; any other error returns no records.
func (e *Etcd) List(ctx context.Context) ([]Record, error) {
	var out []Record
	var skipped skipList
	start, end := e.prefix, clientv3.GetPrefixRangeEnd(e.prefix)
	var rev int64
	for {
		opts := []clientv3.OpOption{clientv3.WithRange(end), clientv3.WithLimit(etcdListPage)}
		if rev != 0 {
			opts = append(opts, clientv3.WithRev(rev))
		}
		var resp *clientv3.GetResponse
		err := e.do(ctx, OpList, start, func(ctx context.Context) (err error) {
			resp, err = e.cli.Get(ctx, start, opts...)
			return err
		})
		if err != nil {
			return nil, err
		}
		if rev == 0 {
			rev = resp.Header.Revision
		}
		for _, kv := range resp.Kvs {
			r, err := e.decodeEtcd(string(kv.Key), kv.Value)
			if err != nil {
				skipped.add(string(kv.Key), err)
				continue
			}
			out = append(out, r)
		}
		if !resp.More || len(resp.Kvs) == 0 {
			break
		}
		start = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
	if err := skipped.err(); err != nil {
		e.log.Warn("binding records skipped", logkey.Error, err.Error())
		return out, err
	}
	return out, nil
}
