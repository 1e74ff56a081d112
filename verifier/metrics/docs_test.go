package metrics

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// registered is the name of every metric family the registry describes,
// those with no series yet included.
func registered(t *testing.T, m *Metrics) []string {
	t.Helper()
	ch := make(chan *prometheus.Desc)
	go func() { m.Registry().Describe(ch); close(ch) }()
	fqName := regexp.MustCompile(`fqName: "([^"]+)"`)
	var names []string
	for d := range ch {
		sub := fqName.FindStringSubmatch(d.String())
		if sub == nil {
			t.Fatalf("cannot read the name of %s", d)
		}
		names = append(names, sub[1])
	}
	slices.Sort(names)
	return slices.Compact(names)
}

// documented is the first column of docs/metrics.md's metric table:
// names, and families written as "prefix_*".
func documented(t *testing.T) (names, families []string) {
	t.Helper()
	doc, err := os.ReadFile("../../docs/metrics.md")
	if err != nil {
		t.Fatal(err)
	}
	row := regexp.MustCompile("(?m)^\\| `([a-z_:]+\\*?)` \\| *(counter|gauge|histogram|summary)? *\\|")
	for _, m := range row.FindAllStringSubmatch(string(doc), -1) {
		if p, ok := strings.CutSuffix(m[1], "*"); ok {
			families = append(families, p)
		} else {
			names = append(names, m[1])
		}
	}
	if len(names) < 10 {
		t.Fatalf("read %d metric rows from docs/metrics.md; the table changed shape", len(names))
	}
	return names, families
}

// TestDocsListEveryMetric: every registered metric has a row in
// docs/metrics.md (or falls in a documented family), and every row names
// a registered metric.
func TestDocsListEveryMetric(t *testing.T) {
	reg := registered(t, New())
	names, families := documented(t)
	inFamily := func(n string) bool {
		return slices.ContainsFunc(families, func(p string) bool { return strings.HasPrefix(n, p) })
	}
	for _, n := range reg {
		if !slices.Contains(names, n) && !inFamily(n) {
			t.Errorf("%s is exported but not in docs/metrics.md", n)
		}
	}
	for _, n := range names {
		if !slices.Contains(reg, n) {
			t.Errorf("docs/metrics.md lists %s, which the verifier does not export", n)
		}
	}
	for _, p := range families {
		if !slices.ContainsFunc(reg, func(n string) bool { return strings.HasPrefix(n, p) }) {
			t.Errorf("docs/metrics.md lists the family %s*, of which the verifier exports nothing", p)
		}
	}
	// Only the runtime collectors may be documented as a family.
	for _, n := range reg {
		if strings.HasPrefix(n, namespace+"_") && !slices.Contains(names, n) {
			t.Errorf("%s must have a row of its own", n)
		}
	}
}
