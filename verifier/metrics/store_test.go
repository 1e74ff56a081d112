package metrics

import (
	"errors"
	"testing"
	"time"
)

func TestStoreMetrics(t *testing.T) {
	m := New()
	m.StoreRequest("claim", 3*time.Millisecond, nil)
	m.StoreRequest("claim", 2*time.Second, errors.New("etcdserver: request timed out"))
	m.StoreRequest("get", 700*time.Microsecond, nil)
	expect(t, scrape(t, m), map[string]string{
		`latchkey_verifier_store_request_duration_seconds_count{op="claim"}`:             "2",
		`latchkey_verifier_store_request_duration_seconds_bucket{op="claim",le="0.005"}`: "1",
		`latchkey_verifier_store_request_duration_seconds_bucket{op="claim",le="2.5"}`:   "2",
		`latchkey_verifier_store_request_duration_seconds_count{op="get"}`:               "1",
		`latchkey_verifier_store_errors_total{op="claim"}`:                               "1",
	})
	if _, ok := scrape(t, m)[`latchkey_verifier_store_errors_total{op="get"}`]; ok {
		t.Error("an error counted for get, which had none")
	}
	var none *Metrics
	none.StoreRequest("get", time.Millisecond, nil) // a nil *Metrics records nothing
}
