package load

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/latchkey/latchkey/verifier/binding"
)

// memBindings is the binding registry in memory. The load verifier mints
// tokens in memory (memMinter), which stands in for Kubernetes mode, and
// in Kubernetes mode the bindings live in Leases on the API server, not
// in this process; the directory store (disk-only mode, fsynced files)
// has its own benchmark in verifier/binding. memBindings keeps the same
// create-if-absent and identity rules, so every join still claims its
// disk and node name.
type memBindings struct {
	mu      sync.Mutex
	records map[string]binding.Record
}

var _ binding.Store = (*memBindings)(nil)

func key(k binding.Kind, name string) string { return string(k) + "/" + name }

func (m *memBindings) Claim(_ context.Context, k binding.Kind, name, id string) (binding.Record, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.records == nil {
		m.records = map[string]binding.Record{}
	}
	if r, ok := m.records[key(k, name)]; ok && r.Bound() {
		return r, binding.Check(r, id)
	}
	r := binding.Record{Kind: k, Name: name, Identity: id, Created: time.Now()}
	m.records[key(k, name)] = r
	return r, nil
}

func (m *memBindings) Get(_ context.Context, k binding.Kind, name string) (binding.Record, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	r, ok := m.records[key(k, name)]
	if !ok {
		return binding.Record{}, fmt.Errorf("%w: %s %s", binding.ErrNotFound, k, name)
	}
	return r, nil
}

func (m *memBindings) SetToken(_ context.Context, node, id, tok string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	r, ok := m.records[key(binding.Node, node)]
	if !ok {
		return fmt.Errorf("%w: node %s", binding.ErrNotFound, node)
	}
	if err := binding.Check(r, id); err != nil {
		return err
	}
	r.TokenID = tok
	m.records[key(binding.Node, node)] = r
	return nil
}

func (m *memBindings) Release(_ context.Context, k binding.Kind, name, by string) (binding.Record, error) {
	return binding.Record{}, fmt.Errorf("memBindings: release is not part of the load benchmark")
}

func (m *memBindings) List(context.Context) ([]binding.Record, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]binding.Record, 0, len(m.records))
	for _, r := range m.records {
		out = append(out, r)
	}
	return out, nil
}
