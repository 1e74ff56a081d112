package app_test

import (
	"context"
	"encoding/json"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/latchkey/latchkey/attest/tpm"
	tpmissuer "github.com/latchkey/latchkey/attest/tpm/issuer"
	"github.com/latchkey/latchkey/attest/tpm/tpmtest"
	"github.com/latchkey/latchkey/internal/strictyaml"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

// The monitoring pack of verifier/deploy is held to what a live verifier
// exports: a renamed metric breaks this test, not an operator's
// dashboard or alert.

// ruleFile is prometheus-rules.yaml, read strictly.
type ruleFile struct {
	Groups []struct {
		Name  string `json:"name"`
		Rules []struct {
			Record      string            `json:"record,omitempty"`
			Alert       string            `json:"alert,omitempty"`
			Expr        string            `json:"expr"`
			For         string            `json:"for,omitempty"`
			Labels      map[string]string `json:"labels,omitempty"`
			Annotations map[string]string `json:"annotations,omitempty"`
		} `json:"rules"`
	} `json:"groups"`
}

func readRules(t *testing.T) ruleFile {
	t.Helper()
	data, err := os.ReadFile("../deploy/prometheus-rules.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var rf ruleFile
	if err := strictyaml.Unmarshal(data, &rf); err != nil {
		t.Fatal(err)
	}
	return rf
}

// dashboardExprs returns every PromQL query of the Grafana dashboard.
func dashboardExprs(t *testing.T) []string {
	t.Helper()
	data, err := os.ReadFile("../deploy/grafana-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatal(err)
	}
	var exprs []string
	for _, p := range d.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q queries nothing", p.Title)
		}
		for _, tg := range p.Targets {
			exprs = append(exprs, tg.Expr)
		}
	}
	return exprs
}

var (
	promString   = regexp.MustCompile(`"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'`)
	promMatchers = regexp.MustCompile(`\{[^}]*\}`)
	promRange    = regexp.MustCompile(`\[[^\]]*\]`)
	promGrouping = regexp.MustCompile(`\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`)
	promIdent    = regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*(\s*\()?`)
	promNumber   = regexp.MustCompile(`(^|[^a-zA-Z0-9_:])[0-9][0-9.]*([eE][+-]?[0-9]+)?[a-zA-Z]*`)
	promKeywords = []string{"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring",
		"group_left", "group_right", "inf", "nan", "Inf", "NaN"}
)

// metricNames returns the metric names a PromQL expression selects:
// identifiers outside strings, label matchers, ranges and groupings that
// are not a function, an aggregation or a keyword.
func metricNames(expr string) []string {
	e := promString.ReplaceAllString(expr, `""`)
	e = promMatchers.ReplaceAllString(e, " ")
	e = promRange.ReplaceAllString(e, " ")
	e = promGrouping.ReplaceAllString(e, " ")
	e = promNumber.ReplaceAllString(e, "$1 ")
	var names []string
	for _, m := range promIdent.FindAllString(e, -1) {
		if strings.HasSuffix(m, "(") || slices.Contains(promKeywords, m) {
			continue
		}
		names = append(names, m)
	}
	return names
}

func TestMetricNamesOfPromQL(t *testing.T) {
	for expr, want := range map[string]string{
		`sum by (result) (rate(latchkey_verifier_joins_total{job="x",reason=~"a|b"}[5m]))`:         "latchkey_verifier_joins_total",
		`latchkey:join_refusal_ratio:rate10m > 0.2 and sum(rate(a_total[10m] offset 5m)) > 0.05`:   "latchkey:join_refusal_ratio:rate10m a_total",
		`histogram_quantile(0.99, sum by (variant, le) (rate(x_bucket{le="+Inf"}[5m])))`:           "x_bucket",
		`(exp_seconds - time()) < 14 * 86400 and on (instance) up == 1`:                            "exp_seconds up",
		"absent(up{job=\"latchkey-verifier\"} == 1)":                                               "up",
		`max without (instance) (latchkey_verifier_reattest_nodes{state="stale"}) > bool 0`:        "latchkey_verifier_reattest_nodes",
		`sum(rate(latchkey_verifier_joins_totl[5m]))`:                                              "latchkey_verifier_joins_totl",
		`clamp_min(sum(increase(m_total[30m])) - sum(increase(r_total{cause=~"used|x"}[30m])), 0)`: "m_total r_total",
	} {
		if got := strings.Join(metricNames(expr), " "); got != want {
			t.Errorf("metricNames(%s) = %q, want %q", expr, got, want)
		}
	}
}

// exported returns the metric names a /metrics body holds: families and
// the sample names of histograms.
func exported(body string) []string {
	var names []string
	for _, line := range strings.Split(body, "\n") {
		if f, ok := strings.CutPrefix(line, "# TYPE "); ok {
			names = append(names, strings.Fields(f)[0])
			continue
		}
		if line == "" || line[0] == '#' {
			continue
		}
		if i := strings.IndexAny(line, "{ "); i > 0 {
			names = append(names, line[:i])
		}
	}
	slices.Sort(names)
	return slices.Compact(names)
}

// TestMonitoringPackQueriesOnlyExportedMetrics starts the verifier, joins
// once and refuses once on swtpm, restarts it on the same state (the
// disks-by-generation gauge is counted at start), scrapes /metrics of
// both and checks that every
// metric the dashboard and the rules name is there; recording rules
// must be defined in the rules file, and only "up" comes from
// Prometheus itself.
func TestMonitoringPackQueriesOnlyExportedMetrics(t *testing.T) {
	sim := tpmtest.Start(t)
	ref, err := tpmissuer.Measure(context.Background(), sim.Device, testPCRs)
	if err != nil {
		t.Fatal(err)
	}
	_, cfg := verifierFiles(t, map[string]any{"tpm": tpm.Policy{PCRs: ref.PCRs, EKCARoots: sim.EKCARootsPEM}}, randomSecret(), "pack")
	cfg.MetricsListen = freeAddr(t)
	r := startRig(t, sim, cfg)
	if _, err := r.agent(t, r.issuer(t), 30*time.Second).Get(context.Background(), worker()); err != nil {
		t.Fatal(err)
	}
	r.sim.Extend(t, 14, []byte("tampered"))
	r.refusedWithTokens(t, r.issuer(t), worker(), latchkeyv1.Reason_PCR_MISMATCH, 1)
	have := exported(scrape(t, cfg.MetricsListen))
	r.stop()
	cfg.MetricsListen = freeAddr(t)
	startRig(t, sim, cfg)
	// The disks-by-generation gauge is counted by a loop that starts
	// with the verifier: the first scrape can precede its first count.
	var second []string
	waitFor(t, "the first disks-by-generation count", func() bool {
		second = exported(scrape(t, cfg.MetricsListen))
		return slices.Contains(second, "latchkey_verifier_disks_by_key_generation")
	})
	have = append(have, second...)

	rf := readRules(t)
	recorded := []string{}
	var ruleExprs []string
	for _, g := range rf.Groups {
		for _, rule := range g.Rules {
			if rule.Record != "" {
				recorded = append(recorded, rule.Record)
			}
			ruleExprs = append(ruleExprs, rule.Expr)
		}
	}
	check := func(where string, exprs []string) {
		t.Helper()
		n := 0
		for _, e := range exprs {
			for _, name := range metricNames(e) {
				n++
				switch {
				case name == "up":
				case strings.Contains(name, ":"):
					if !slices.Contains(recorded, name) {
						t.Errorf("%s: %q uses the recording rule %s, which prometheus-rules.yaml does not define", where, e, name)
					}
				case !slices.Contains(have, name):
					t.Errorf("%s: %q uses %s, which the verifier does not export", where, e, name)
				}
			}
		}
		if n < 10 {
			t.Errorf("%s: found only %d metric names; the parse missed some", where, n)
		}
	}
	check("grafana-dashboard.json", dashboardExprs(t))
	check("prometheus-rules.yaml", ruleExprs)
	if t.Failed() {
		t.Logf("exported: %v", have)
	}
}

// TestDocsListEveryRule: docs/metrics.md has one row per alert and per
// recording rule of prometheus-rules.yaml, and no row for a rule the file
// does not have.
func TestDocsListEveryRule(t *testing.T) {
	doc, err := os.ReadFile("../../docs/metrics.md")
	if err != nil {
		t.Fatal(err)
	}
	var inFile, inDoc []string
	for _, g := range readRules(t).Groups {
		for _, r := range g.Rules {
			inFile = append(inFile, r.Alert+r.Record)
		}
	}
	row := regexp.MustCompile("(?m)^\\| `(Latchkey[A-Za-z]+|latchkey:[a-z0-9_:]+)` \\|")
	for _, m := range row.FindAllStringSubmatch(string(doc), -1) {
		inDoc = append(inDoc, m[1])
	}
	slices.Sort(inFile)
	slices.Sort(inDoc)
	if !slices.Equal(inFile, inDoc) {
		t.Errorf("rules in prometheus-rules.yaml:\n%v\nrows in docs/metrics.md:\n%v", inFile, inDoc)
	}
}
