package storm

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"k8s.io/client-go/kubernetes"
)

// apiRequests is the API server's requests so far (its
// apiserver_request_total, every client's), summed over response codes
// and scopes by "VERB resource" (or "VERB resource/subresource").
func apiRequests(b *testing.B, admin kubernetes.Interface) map[string]float64 {
	b.Helper()
	raw, err := admin.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(context.Background())
	if err != nil {
		b.Fatalf("read the API server's metrics: %v", err)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(raw))
	if err != nil {
		b.Fatalf("parse the API server's metrics: %v", err)
	}
	out := map[string]float64{}
	for _, m := range fams["apiserver_request_total"].GetMetric() {
		l := map[string]string{}
		for _, p := range m.GetLabel() {
			l[p.GetName()] = p.GetValue()
		}
		key := l["verb"] + " " + l["resource"]
		if l["subresource"] != "" {
			key += "/" + l["subresource"]
		}
		out[key] += m.GetCounter().GetValue()
	}
	return out
}

// requestsSince is now's counts less before's, without the zeros.
func requestsSince(before, now map[string]float64) map[string]float64 {
	out := map[string]float64{}
	for k, v := range now {
		if d := v - before[k]; d > 0 {
			out[k] = d
		}
	}
	return out
}

// requestTotals counts the per-join part of d: writes (POST, PUT, PATCH,
// DELETE) and reads (GET). LIST and WATCH are left out, being the
// controllers' and this harness's polls and streams, not a join's.
func requestTotals(d map[string]float64) (writes, reads float64) {
	for k, v := range d {
		switch verb, _, _ := strings.Cut(k, " "); verb {
		case "POST", "PUT", "PATCH", "DELETE":
			writes += v
		case "GET":
			reads += v
		}
	}
	return writes, reads
}

// printRequests prints latchkey's and the baseline's API requests per
// join side by side, the largest first.
func printRequests(w io.Writer, lk map[string]float64, lkJoins int, base map[string]float64, baseJoins int) {
	ln, bn := float64(max(lkJoins, 1)), float64(max(baseJoins, 1))
	lw, lr := requestTotals(lk)
	bw, br := requestTotals(base)
	fmt.Fprintf(w, "API requests per join (apiserver_request_total, every client): latchkey %.1f writes + %.1f gets, baseline %.1f writes + %.1f gets\n",
		lw/ln, lr/ln, bw/bn, br/bn)
	keys := slices.Collect(maps.Keys(lk))
	for k := range base {
		if _, ok := lk[k]; !ok {
			keys = append(keys, k)
		}
	}
	slices.SortFunc(keys, func(a, b string) int {
		return cmp.Or(cmp.Compare(lk[b]/ln+base[b]/bn, lk[a]/ln+base[a]/bn), strings.Compare(a, b))
	})
	for _, k := range keys {
		if lk[k]/ln < 0.05 && base[k]/bn < 0.05 {
			continue
		}
		fmt.Fprintf(w, "  %-40s latchkey %6.2f  baseline %6.2f\n", k, lk[k]/ln, base[k]/bn)
	}
}

// The counts of one storm are the difference of two scrapes; the
// per-join totals leave LIST and WATCH out.
func TestRequestCounts(t *testing.T) {
	before := map[string]float64{"POST leases": 10, "GET leases": 5, "LIST secrets": 1}
	now := map[string]float64{"POST leases": 16, "GET leases": 5, "LIST secrets": 9, "PUT certificatesigningrequests/approval": 3,
		"DELETE secrets": 3, "WATCH nodes": 1, "GET secrets": 2}
	d := requestsSince(before, now)
	if _, ok := d["GET leases"]; ok || d["POST leases"] != 6 || d["LIST secrets"] != 8 {
		t.Fatalf("since: %v", d)
	}
	if w, r := requestTotals(d); w != 12 || r != 2 {
		t.Fatalf("writes %v, reads %v; want 12 and 2", w, r)
	}
	var out strings.Builder
	printRequests(&out, d, 3, map[string]float64{"POST certificatesigningrequests": 3}, 3)
	if got := out.String(); !strings.Contains(got, "latchkey 4.0 writes + 0.7 gets, baseline 1.0 writes + 0.0 gets") ||
		!strings.Contains(got, "POST leases") || !strings.Contains(got, "latchkey   0.00  baseline   1.00") {
		t.Fatalf("printed:\n%s", got)
	}
}
