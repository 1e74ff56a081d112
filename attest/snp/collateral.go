package snp

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"

	"github.com/google/go-sev-guest/abi"
	"github.com/latchkey/latchkey/internal/logkey"
)

// ErrCollateralMissing says a cache holds no certificate under the name
// asked for.
var ErrCollateralMissing = errors.New("snp collateral missing")

// maxCertSize bounds one certificate read from disk, a store or AMD KDS.
// A VCEK is about 1.4 KiB.
const maxCertSize = 16 << 10

// Store shares fetched VCEK certificates between verifier replicas
// (kubestore.ConfigMapStore). Names are VCEKFileName values.
type Store interface {
	// Get returns the certificate stored under name, or an error wrapping
	// ErrCollateralMissing.
	Get(ctx context.Context, name string) ([]byte, error)
	// Put stores der under name.
	Put(ctx context.Context, name string, der []byte) error
}

// CollateralConfig configures NewCollateral.
type CollateralConfig struct {
	// Dir is the on-disk cache the operator fills ahead of time, "" for
	// none. Layout:
	//
	//	<Dir>/<product line>/ark.pem    AMD root key (PEM), for reference
	//	<Dir>/<product line>/ask.pem    AMD SEV key (PEM), for reference
	//	<Dir>/<product line>/vcek-<CHIP_ID, 128 hex>-<TCB, 16 hex>.der
	//
	// with product line Milan, Genoa or Turin and TCB the report's
	// REPORTED_TCB as a big-endian 64-bit hex number. ark.pem and ask.pem
	// are never trusted from here: trust comes from Policy.TrustedRoots or
	// the AMD roots go-sev-guest ships. FetchCollateral fills the layout.
	Dir string
	// Store, when set, is read on a miss in memory and Dir, and written by
	// Add, so every replica sees what one fetched.
	Store Store
	// Logger receives cache errors (default slog.Default()).
	Logger *slog.Logger
}

// Collateral finds VCEK certificates for reports whose host supplied no
// certificate table: first in memory, then in Dir, then in Store. It never
// touches the network; FetchCollateral and Fetch fill it ahead of time.
// Safe for concurrent use; lookups that hit memory take no lock.
type Collateral struct {
	dir   string
	store Store
	log   *slog.Logger
	mem   sync.Map // VCEKFileName -> []byte
}

// NewCollateral returns a cache over cfg.Dir and cfg.Store.
func NewCollateral(cfg CollateralConfig) (*Collateral, error) {
	if cfg.Dir != "" {
		fi, err := os.Stat(cfg.Dir)
		if err != nil {
			return nil, fmt.Errorf("collateral dir: %w", err)
		}
		if !fi.IsDir() {
			return nil, fmt.Errorf("collateral dir %s is not a directory", cfg.Dir)
		}
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	return &Collateral{dir: cfg.Dir, store: cfg.Store, log: log}, nil
}

// VCEKFileName is the name a VCEK is kept under, on disk and in a Store:
// "vcek-<CHIP_ID hex>-<TCB as 16 hex digits>.der".
func VCEKFileName(chipID []byte, tcb uint64) string {
	return fmt.Sprintf("vcek-%s-%016x.der", hex.EncodeToString(chipID), tcb)
}

// VCEK returns the DER VCEK certificate for chipID at tcb. productLine may
// be "" (version 2 reports do not name it); then every product directory
// is searched. Errors other than a miss are logged and count as a miss,
// so the result is the certificate or an error wrapping
// ErrCollateralMissing.
func (c *Collateral) VCEK(ctx context.Context, productLine string, chipID []byte, tcb uint64) ([]byte, error) {
	if len(chipID) != abi.ChipIDSize {
		return nil, fmt.Errorf("chip ID of %d bytes: %w", len(chipID), ErrCollateralMissing)
	}
	name := VCEKFileName(chipID, tcb)
	if v, ok := c.mem.Load(name); ok {
		return v.([]byte), nil
	}
	der, err := c.fromDisk(productLine, name)
	if errors.Is(err, ErrCollateralMissing) {
		der, err = c.fromStore(ctx, name)
	}
	if err != nil {
		return nil, err
	}
	c.mem.Store(name, der)
	return der, nil
}

func (c *Collateral) fromDisk(productLine, name string) ([]byte, error) {
	if c.dir == "" {
		return nil, ErrCollateralMissing
	}
	lines := productLines
	if productLine != "" {
		if !slices.Contains(productLines, productLine) {
			return nil, fmt.Errorf("product line %q: %w", productLine, ErrCollateralMissing)
		}
		lines = []string{productLine}
	}
	for _, line := range lines {
		der, err := readLimited(filepath.Join(c.dir, line, name))
		if err == nil {
			return der, nil
		}
		if !errors.Is(err, fs.ErrNotExist) {
			c.log.Warn("snp collateral: read cached VCEK", logkey.Product, line, logkey.File, name, logkey.Error, err)
		}
	}
	return nil, ErrCollateralMissing
}

func (c *Collateral) fromStore(ctx context.Context, name string) ([]byte, error) {
	if c.store == nil {
		return nil, ErrCollateralMissing
	}
	der, err := c.store.Get(ctx, name)
	if err == nil && (len(der) == 0 || len(der) > maxCertSize) {
		err = fmt.Errorf("stored certificate of %d bytes", len(der))
	}
	if err != nil {
		if !errors.Is(err, ErrCollateralMissing) {
			c.log.Warn("snp collateral: shared store", logkey.File, name, logkey.Error, err)
		}
		return nil, ErrCollateralMissing
	}
	return der, nil
}

// Add keeps der as the VCEK of chipID at tcb in memory and, when a Store
// is configured, in the Store for the other replicas.
func (c *Collateral) Add(ctx context.Context, chipID []byte, tcb uint64, der []byte) error {
	if len(chipID) != abi.ChipIDSize || len(der) == 0 || len(der) > maxCertSize {
		return fmt.Errorf("add vcek: chip ID of %d bytes, certificate of %d bytes", len(chipID), len(der))
	}
	name := VCEKFileName(chipID, tcb)
	c.mem.Store(name, slices.Clone(der))
	if c.store == nil {
		return nil
	}
	if err := c.store.Put(ctx, name, der); err != nil {
		return fmt.Errorf("share vcek: %w", err)
	}
	return nil
}

func readLimited(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxCertSize+1))
	if err != nil {
		return nil, err
	}
	if len(b) == 0 || len(b) > maxCertSize {
		return nil, fmt.Errorf("%s: %d bytes is not a certificate", path, len(b))
	}
	return b, nil
}
