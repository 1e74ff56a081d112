package app

import (
	"context"
	"errors"
	"fmt"
	"github.com/latchkey/latchkey/internal/logkey"
	"time"

	"github.com/latchkey/latchkey/verifier/binding"
	"github.com/latchkey/latchkey/verifier/keys"
)

// MasterSecret is one entry of masterSecrets: a numbered generation of
// the master secret (docs/operations.md, "Rotating the master secret").
type MasterSecret struct {
	// Generation is the secret's number (required; 0 is the secret of a
	// cluster that never rotated, the one masterSecretFile names).
	Generation *uint32 `json:"generation"`
	// File holds the secret (default: the systemd credential
	// latchkey-master-secret.<generation>).
	File string `json:"file,omitempty"`
	// Current marks the generation new disk keys are derived from;
	// exactly one entry has it.
	Current bool `json:"current,omitempty"`
}

// validateMasterSecrets checks masterSecrets: not together with
// masterSecretFile, every generation given and at most
// keys.MaxGeneration, generations unique, exactly one current.
func (c *Config) validateMasterSecrets() error {
	if len(c.MasterSecrets) == 0 {
		return nil
	}
	if c.MasterSecretFile != "" {
		return errors.New("masterSecretFile and masterSecrets are mutually exclusive: masterSecretFile is generation 0 " +
			"(list it as masterSecrets: [{generation: 0, file: ..., current: true}] and remove masterSecretFile)")
	}
	seen := map[uint32]bool{}
	current := 0
	for i, s := range c.MasterSecrets {
		switch {
		case s.Generation == nil:
			return fmt.Errorf("masterSecrets[%d]: generation is required", i)
		case *s.Generation > keys.MaxGeneration:
			return fmt.Errorf("masterSecrets[%d]: generation %d is over %d", i, *s.Generation, keys.MaxGeneration)
		case seen[*s.Generation]:
			return fmt.Errorf("masterSecrets[%d]: generation %d is listed twice", i, *s.Generation)
		}
		seen[*s.Generation] = true
		if s.Current {
			current++
		}
	}
	if current != 1 {
		return fmt.Errorf("masterSecrets: %d entries are marked current: true, want exactly one", current)
	}
	return nil
}

// Deriver loads cfg's master secrets (masterSecrets, or masterSecretFile
// / the credential latchkey-master-secret as generation 0) and returns
// the deriver the verifier serves with (also for offline commands: secret
// id, recover-key).
func Deriver(cfg *Config) (*keys.Deriver, error) {
	if err := cfg.validateMasterSecrets(); err != nil {
		return nil, err
	}
	if len(cfg.MasterSecrets) == 0 {
		master, err := keys.LoadMasterSecret(cfg.MasterSecretFile)
		if err != nil {
			return nil, err
		}
		defer clear(master)
		return keys.NewDeriver(master, []byte(cfg.ClusterSalt))
	}
	var secrets []keys.Secret
	defer func() {
		for _, s := range secrets {
			clear(s.Bytes)
		}
	}()
	var current uint32
	for _, s := range cfg.MasterSecrets {
		b, err := keys.LoadGenerationSecret(*s.Generation, s.File)
		if err != nil {
			return nil, err
		}
		secrets = append(secrets, keys.Secret{Generation: *s.Generation, Bytes: b})
		if s.Current {
			current = *s.Generation
		}
	}
	return keys.NewGenerations(secrets, current, []byte(cfg.ClusterSalt))
}

// logGenerations logs and exports every served generation's key ID, so
// replicas can be compared (they must list the same generations with the
// same IDs).
func (v *Verifier) logGenerations() {
	gens := v.keys.Generations()
	for _, g := range gens {
		v.deps.Logger.Info("master secret loaded", logkey.KeyID, g.KeyID, logkey.KeyGeneration, g.Generation, logkey.Current, g.Current)
	}
	v.metrics.MasterSecretsLoaded(gens)
}

// generationCountInterval is how often the disks-by-generation gauge is
// recounted from the binding records.
const generationCountInterval = time.Minute

// countGenerations keeps latchkey_verifier_disks_by_key_generation up to
// date from the binding records until ctx ends (only with metrics on).
func (v *Verifier) countGenerations(ctx context.Context) {
	if v.metrics == nil {
		return
	}
	t := time.NewTicker(generationCountInterval)
	defer t.Stop()
	for {
		recs, err := v.bindings.List(ctx)
		if _, err = binding.Skipped(err); err == nil {
			// Skipped records are not counted; `bindings list` names them.
			v.metrics.DisksByKeyGeneration(binding.CountByGeneration(recs))
		} else if ctx.Err() == nil {
			v.deps.Logger.Warn("count disks by key generation", logkey.Error, err.Error())
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
