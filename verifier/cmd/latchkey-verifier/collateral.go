package main

import (
	"context"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/latchkey/latchkey/attest/snp"
	"github.com/latchkey/latchkey/attest/tdx"
	"github.com/latchkey/latchkey/internal/cli"
	"github.com/latchkey/latchkey/internal/logging"
	"github.com/latchkey/latchkey/verifier/app"
	"github.com/latchkey/latchkey/verifier/exitcode"
	"github.com/latchkey/latchkey/verifier/policy"
)

// collateralCmd fetches one chip's VCEK (and its product's ASK/ARK) from
// AMD KDS into the offline cache, honouring KDS rate limits. It is the
// only command that uses the network; the join path never does.
func collateralCmd(fs *flag.FlagSet) cli.Runner {
	var f serveFlags
	f.register(fs, "config")
	lf := cli.RegisterLogFlags(fs)
	product := fs.String("product", "Milan", "product line: Milan, Genoa or Turin")
	chipHex := fs.String("chip-id", "", "chip ID (128 hex digits, from the report or the refusal)")
	tcb := fs.Uint64("tcb", 0, "reported TCB version (from the report or the refusal)")
	fmspc := fs.String("tdx-fmspc", "", "TDX: fetch Intel's collateral for this platform family (12 hex digits, from the refusal) instead of a VCEK")
	ca := fs.String("tdx-ca", "platform", "TDX: the PCK CA of the platform: platform or processor")
	return func(args []string, stdout, stderr io.Writer) int {
		if len(args) != 0 {
			return usageError(stderr, "collateral fetch")
		}
		if *fmspc != "" {
			return collateralFetchTDX(&f, *fmspc, *ca, stdout, stderr)
		}
		return collateralFetch(&f, lf, *product, *chipHex, *tcb, stdout, stderr)
	}
}

// collateralFetchTDX fills tdxCollateralDir from Intel PCS for one
// platform family, checking what it fetched against the policy's TDX
// trusted roots (Intel's SGX root CA when the policy names none).
func collateralFetchTDX(f *serveFlags, fmspc, ca string, stdout, stderr io.Writer) int {
	fmspc = strings.ToLower(fmspc)
	if raw, err := hex.DecodeString(fmspc); err != nil || len(raw) != 6 {
		fmt.Fprintln(stderr, "latchkey-verifier collateral fetch: --tdx-fmspc must be 12 hex digits")
		return exitcode.BadConfig
	}
	if ca != "platform" && ca != "processor" {
		fmt.Fprintln(stderr, "latchkey-verifier collateral fetch: --tdx-ca must be platform or processor")
		return exitcode.BadConfig
	}
	cfg, err := f.loadFile()
	if err != nil || cfg.TDXCollateralDir == "" {
		fmt.Fprintln(stderr, "latchkey-verifier collateral fetch: no tdxCollateralDir configured", err)
		return exitcode.BadConfig
	}
	var tp tdx.Policy
	if data, err := policy.ReadFile(cfg.Policy); err == nil {
		if p, err := policy.Parse(data); err == nil && p.TDX != nil {
			tp = p.TDX.Policy
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := tdx.FetchCollateral(ctx, &tdx.PCSGetter{}, tp, fmspc, ca, cfg.TDXCollateralDir, time.Now()); err != nil {
		fmt.Fprintln(stderr, "latchkey-verifier collateral fetch:", err)
		return exitcode.Failed
	}
	fmt.Fprintf(stdout, "cached TDX collateral for FMSPC %s (%s CA) in %s\n", fmspc, ca, cfg.TDXCollateralDir)
	return exitcode.OK
}

func collateralFetch(f *serveFlags, lf *cli.LogFlags, product, chipHex string, tcb uint64, stdout, stderr io.Writer) int {
	chipID, err := hex.DecodeString(chipHex)
	if err != nil || len(chipID) != 64 {
		fmt.Fprintln(stderr, "latchkey-verifier collateral fetch: --chip-id must be 128 hex digits")
		return exitcode.BadConfig
	}
	cfg, err := f.loadFile()
	if err != nil || cfg.SNPCollateralDir == "" {
		fmt.Fprintln(stderr, "latchkey-verifier collateral fetch: no snpCollateralDir configured", err)
		return exitcode.BadConfig
	}
	logCfg, err := lf.Resolve(cfg.Log)
	if err != nil {
		fmt.Fprintln(stderr, "latchkey-verifier collateral fetch:", err)
		return exitcode.BadConfig
	}
	coll, err := app.NewCollateral(cfg, nil, logging.New(logCfg))
	if err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		_, err = coll.Fetch(ctx, &snp.KDSGetter{}, product, chipID, tcb)
	}
	if err != nil {
		fmt.Fprintln(stderr, "latchkey-verifier collateral fetch:", err)
		return exitcode.Failed
	}
	fmt.Fprintf(stdout, "cached %s in %s\n", snp.VCEKFileName(chipID, tcb), cfg.SNPCollateralDir)
	return exitcode.OK
}
