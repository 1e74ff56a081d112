package binding

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// ImportConflictError is a record import refused because etcd holds
// another binding for the same name.
type ImportConflictError struct {
	Key        string
	Have, Want Record
}

func (e *ImportConflictError) Error() string {
	return fmt.Sprintf("binding: etcd record %s is bound to %q; the imported record says %q", e.Key, describeBinding(e.Have), describeBinding(e.Want))
}

func describeBinding(r Record) string {
	if r.Bound() {
		return r.Identity
	}
	return "released"
}

// Import writes r when its key is absent (created true). A record already
// there with the same binding (the same identity, or both released) is
// left as it is, so an import can run again; one with another binding is
// an *ImportConflictError and nothing is written.
func (e *Etcd) Import(ctx context.Context, r Record) (created bool, err error) {
	if !validRecord(r) || r.Created.IsZero() {
		return false, fmt.Errorf("%w: %s %s", ErrInvalid, r.Kind, r.Name)
	}
	key := e.Key(r.Kind, r.Name)
	val, err := encodeEtcd(r)
	if err != nil {
		return false, err
	}
	var resp *clientv3.TxnResponse
	err = e.do(ctx, OpImport, key, func(ctx context.Context) (err error) {
		resp, err = e.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
			Then(clientv3.OpPut(key, val)).Else(clientv3.OpGet(key)).Commit()
		return err
	})
	if err != nil {
		return false, err
	}
	if resp.Succeeded {
		return true, nil
	}
	kvs := resp.Responses[0].GetResponseRange().GetKvs()
	if len(kvs) == 0 {
		return false, fmt.Errorf("binding: etcd record %s was deleted during the import; run it again", key)
	}
	have, err := e.decodeEtcd(key, kvs[0].Value)
	if err != nil {
		return false, err
	}
	if have.Identity != r.Identity {
		return false, &ImportConflictError{Key: key, Have: have, Want: r}
	}
	return false, nil
}

// EtcdStatus is what `latchkey-verifier store check` reports.
type EtcdStatus struct {
	// Records is the number of valid records; Skipped reports the
	// invalid ones (nil when none).
	Records int
	Skipped []SkippedRecord
}

// Check proves the store works for this verifier: a linearizable read and
// a write and delete of a probe key under the prefix (the permissions a
// replica needs), then a listing that counts the records and reports the
// invalid ones.
func (e *Etcd) Check(ctx context.Context) (EtcdStatus, error) {
	probe := strings.TrimSuffix(e.prefix, "bindings/") + "check/probe"
	err := e.do(ctx, OpCheck, probe, func(ctx context.Context) error {
		if _, err := e.cli.Put(ctx, probe, e.now().UTC().Format(time.RFC3339)); err != nil {
			return fmt.Errorf("write: %w", err)
		}
		if _, err := e.cli.Delete(ctx, probe); err != nil {
			return fmt.Errorf("delete: %w", err)
		}
		return nil
	})
	if err != nil {
		return EtcdStatus{}, errors.Join(errors.Unwrap(err), e.diagnose())
	}
	recs, err := e.List(ctx)
	skipped, err := Skipped(err)
	if err != nil {
		return EtcdStatus{}, errors.Unwrap(err)
	}
	return EtcdStatus{Records: len(recs), Skipped: skipped}, nil
}

// diagnose connects to every endpoint and reports the ones that cannot
// be reached or refuse this verifier's TLS: a rejected client
// certificate surfaces only as a timeout through the etcd client, which
// retries, so Check says which endpoint refused it and why.
func (e *Etcd) diagnose() error {
	var errs []error
	for _, ep := range e.endpoints {
		u, err := url.Parse(ep)
		if err != nil {
			continue
		}
		if err := probeEndpoint(u.Host, e.tls, e.timeout); err != nil {
			errs = append(errs, fmt.Errorf("endpoint %s: %w", ep, err))
		}
	}
	return errors.Join(errs...)
}

// probeEndpoint dials addr (with TLS when tc is set) and reads once: a
// server that rejects the client certificate answers with a TLS alert,
// which the read returns (TLS 1.3 sends it after the handshake).
func probeEndpoint(addr string, tc *tls.Config, timeout time.Duration) error {
	d := &net.Dialer{Timeout: timeout}
	conn, err := d.Dial("tcp", addr)
	if err != nil {
		return err
	}
	defer conn.Close()
	if tc == nil {
		return nil
	}
	tc = tc.Clone()
	if tc.ServerName == "" {
		tc.ServerName, _, _ = net.SplitHostPort(addr)
	}
	tconn := tls.Client(conn, tc)
	_ = tconn.SetDeadline(time.Now().Add(timeout))
	if err := tconn.Handshake(); err != nil {
		return fmt.Errorf("tls: %w", err)
	}
	// The client's HTTP/2 preface makes the server answer (or alert).
	if _, err := tconn.Write([]byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")); err != nil {
		return fmt.Errorf("tls: %w", err)
	}
	_ = tconn.SetReadDeadline(time.Now().Add(time.Second))
	var b [1]byte
	if _, err := tconn.Read(b[:]); err != nil {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return nil
		}
		return fmt.Errorf("tls: %w", err)
	}
	return nil
}
