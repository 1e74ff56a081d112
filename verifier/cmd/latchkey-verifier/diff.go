package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"text/tabwriter"
	"time"

	"github.com/latchkey/latchkey/internal/cli"
	"github.com/latchkey/latchkey/verifier/app"
	"github.com/latchkey/latchkey/verifier/binding"
)

// policyDiffCmd lists, for every node whose re-attestations are on its
// Lease, the enforced decision and the candidate policy's (policyNext)
// on the same evidence, as the running verifiers recorded them; nodes the
// candidate would refuse are marked. It reads the Leases with the
// verifier's own credential and changes nothing.
func policyDiffCmd(fs *flag.FlagSet) cli.Runner {
	config := fs.String("config", "", "verifier config file (default "+app.DefaultConfigPath+" when present)")
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig (default: the config's kubernetes.kubeconfig)")
	onlyChanged := fs.Bool("changed", false, "list only nodes the candidate would decide differently")
	return func(args []string, stdout, stderr io.Writer) int {
		if len(args) != 0 {
			return usageError(stderr, "policy diff")
		}
		return policyDiff(*config, *kubeconfig, *onlyChanged, stdout, stderr)
	}
}

func policyDiff(config, kubeconfig string, onlyChanged bool, stdout, stderr io.Writer) int {
	cfg, err := (&serveFlags{config: config}).loadFile()
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 2
	}
	if kubeconfig != "" {
		if cfg.Kubernetes == nil {
			cfg.Kubernetes = &app.Kubernetes{}
		}
		cfg.Kubernetes.Kubeconfig = kubeconfig
	}
	client, err := app.KubeClient(cfg)
	if err != nil {
		fmt.Fprintln(stderr, "policy diff:", err)
		return 2
	}
	ns := ""
	if cfg.Kubernetes != nil {
		ns = cfg.Kubernetes.BindingNamespace
	}
	leases, err := binding.NewLeases(binding.LeaseConfig{Client: client, Namespace: ns, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		fmt.Fprintln(stderr, "policy diff:", err)
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sts, err := leases.NodeStatuses(ctx)
	if err != nil && sts == nil {
		fmt.Fprintln(stderr, "policy diff:", err)
		return 1
	}
	return writeDiff(stdout, sts, onlyChanged, time.Now())
}

// writeDiff prints the table; it returns 1 when the candidate would refuse
// a node the enforced policy accepts (so a deploy script can stop).
func writeDiff(w io.Writer, sts []binding.NodeStatus, onlyChanged bool, now time.Time) int {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tENFORCED\tREASON\tCANDIDATE\tCANDIDATE REASON\tATTESTED")
	code := 0
	for _, st := range sts {
		if st.Last == nil {
			if !onlyChanged {
				fmt.Fprintf(tw, "%s\t-\t-\t-\t-\tnever re-attested\n", st.Node)
			}
			continue
		}
		l := st.Last
		cand, candReason := l.ShadowDecision, l.ShadowReason
		if cand == "" {
			cand, candReason = "-", "-"
		}
		enforced := l.Decision
		if enforced == binding.DecisionAttested {
			enforced = "accepted"
		}
		changed := cand != "-" && cand != enforced
		if changed && cand == "refused" {
			code = 1
		}
		if onlyChanged && !changed {
			continue
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s ago\n", st.Node, enforced, l.Reason, cand, candReason, now.Sub(l.Time).Round(time.Second))
	}
	tw.Flush()
	return code
}
