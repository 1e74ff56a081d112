package service_test

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"

	"github.com/latchkey/latchkey/attest/atls"
	"github.com/latchkey/latchkey/attest/attesttest"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
	"github.com/latchkey/latchkey/verifier/metrics"
)

// streamFrom opens a join stream from the loopback address src
// (127.0.0.x: Linux routes all of 127/8 to lo), a distinct source for
// the verifier's admission control.
func streamFrom(src string) func(t *testing.T, e *env) latchkeyv1.JoinService_JoinClient {
	return func(t *testing.T, e *env) latchkeyv1.JoinService_JoinClient {
		t.Helper()
		cfg, _ := atls.ClientConfig([]atls.Pin{e.pin}, false)
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
		conn, err := grpc.NewClient("passthrough:///"+e.addr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)),
			grpc.WithDisableRetry(), grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
				return d.DialContext(ctx, "tcp", addr)
			}))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		s, err := latchkeyv1.NewJoinServiceClient(conn).Join(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
}

// A client without a TPM gets the credential-activation challenge and
// never answers. N such streams from N addresses (N above the slot count)
// hold no admission slot while they wait, so every real join, run while
// they are held and given a single attempt, succeeds.
func TestHeldChallengesDoNotStarveJoins(t *testing.T) {
	const slots, held, joins = 4, 6, 8
	m := metrics.New()
	e := startVerifier(t, envOpt{challenge: true, maxInFlight: slots, metrics: m, challengeTimeout: time.Hour})
	for i := range held {
		free := holdChallenge(t, e, streamFrom(fmt.Sprintf("127.0.0.%d", 2+i)))
		defer free()
	}
	if got := sample(t, m, "latchkey_verifier_joins_in_flight", ""); got != 0 {
		t.Fatalf("joins_in_flight with %d held challenges = %v, want 0", held, got)
	}
	c := clientOnce(t, e, &attesttest.Issuer{})
	var wg sync.WaitGroup
	errs := make([]error, joins)
	for i := range joins {
		wg.Go(func() {
			q := worker(fmt.Sprintf("00000000-0000-4000-8000-%012d", i))
			q.NodeName = fmt.Sprintf("real-%d", i)
			tk, err := c.Get(context.Background(), q)
			if err == nil && len(tk.GetDiskKey()) != 32 {
				err = fmt.Errorf("ticket without a disk key")
			}
			errs[i] = err
		})
		if i%2 == 1 { // two at a time: under the slot count
			wg.Wait()
		}
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("real join %d while %d challenges were held: %v", i, held, err)
		}
	}
}

// Challenge-wait places are capped per source (slots/2, at least 1) and
// in all (4 x slots): past the source's cap a held challenge keeps its
// slot; past the total, the slot is kept too, and once every slot is
// taken the next join is refused at admission.
func TestHeldChallengesCappedPerSource(t *testing.T) {
	m := metrics.New()
	e := startVerifier(t, envOpt{challenge: true, maxInFlight: 4, metrics: m, challengeTimeout: time.Hour})
	inFlight := func() float64 { return sample(t, m, "latchkey_verifier_joins_in_flight", "") }
	one := streamFrom("127.0.0.2")
	for range 2 {
		defer holdChallenge(t, e, one)()
	}
	if got := inFlight(); got != 0 {
		t.Fatalf("two held challenges of one source: %v slots taken, want 0", got)
	}
	defer holdChallenge(t, e, one)()
	if got := inFlight(); got != 1 {
		t.Fatalf("a third held challenge of the source: %v slots taken, want 1 (its own)", got)
	}
	// 16 places in all: 2 taken; 14 more sources fill them.
	for i := range 14 {
		defer holdChallenge(t, e, streamFrom(fmt.Sprintf("127.0.1.%d", i+1)))()
	}
	if got := inFlight(); got != 1 {
		t.Fatalf("16 parked challenges: %v slots taken, want 1", got)
	}
	for i := range 3 {
		defer holdChallenge(t, e, streamFrom(fmt.Sprintf("127.0.2.%d", i+1)))()
	}
	if got := inFlight(); got != 4 {
		t.Fatalf("past the total: %v slots taken, want 4", got)
	}
	s := streamFrom("127.0.3.1")(t, e)
	h := baseHello()
	h.Evidence = fakeEvidence(t, bindingOf(t, s, h))
	s.Send(helloMsg(h))
	_, err := s.Recv()
	if code, r, _ := refusalOf(t, err); code != codes.ResourceExhausted || r != latchkeyv1.Reason_UNAVAILABLE {
		t.Fatalf("every slot and place taken: %v %v, want RESOURCE_EXHAUSTED", code, r)
	}
}

// The wait for a challenge answer has its own bound, far below the join
// timeout: a stream that never answers is refused with a detail naming
// the setting, and audited.
func TestChallengeRoundTripBounded(t *testing.T) {
	e := startVerifier(t, envOpt{challenge: true, challengeTimeout: 50 * time.Millisecond})
	s := rawStream(t, e)
	h := baseHello()
	h.Evidence = fakeEvidence(t, bindingOf(t, s, h))
	s.Send(helloMsg(h))
	if m, err := s.Recv(); err != nil || m.GetChallenge() == nil {
		t.Fatalf("want a challenge, got %v %v", m, err)
	}
	_, err := s.Recv()
	code, r, detail := refusalOf(t, err)
	if want := "no answer to the challenge within 50ms (limits.challengeTimeout)"; code != codes.PermissionDenied ||
		r != latchkeyv1.Reason_ACTIVATION_FAILED || detail != want {
		t.Fatalf("unanswered challenge: %v %v %q, want ACTIVATION_FAILED %q", code, r, detail, want)
	}
	waitLog(t, e, "reason=ACTIVATION_FAILED")
}

// waitLog waits until the verifier's log holds s (the audit line is
// written after the stream's status is sent).
func waitLog(t *testing.T, e *env, s string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(e.logs.String(), s); {
		if time.Now().After(deadline) {
			t.Fatalf("log never held %q:\n%s", s, e.logs)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A join that gave its slot back for its challenge wait takes one again
// with the answer; when every slot was taken meanwhile it is answered like
// any join over the limit: RESOURCE_EXHAUSTED with the retry hint.
func TestAnswerAfterSlotsFilledIsOverloaded(t *testing.T) {
	e := startVerifier(t, envOpt{challenge: true, maxInFlight: 1, challengeTimeout: time.Hour})
	a := streamFrom("127.0.0.2")(t, e)
	h := baseHello()
	h.Evidence = fakeEvidence(t, bindingOf(t, a, h))
	a.Send(helloMsg(h))
	m, err := a.Recv()
	if err != nil || m.GetChallenge() == nil {
		t.Fatalf("want a challenge, got %v %v", m, err)
	}
	// Source .3 parks one challenge in its one place and holds the slot
	// with a second.
	other := streamFrom("127.0.0.3")
	defer holdChallenge(t, e, other)()
	defer holdChallenge(t, e, other)()
	answer := &latchkeyv1.AgentMessage{Msg: &latchkeyv1.AgentMessage_ChallengeResponse{
		ChallengeResponse: &latchkeyv1.ChallengeResponse{Payload: m.GetChallenge().GetPayload()}}}
	if err := a.Send(answer); err != nil {
		t.Fatal(err)
	}
	_, err = a.Recv()
	code, r, detail := refusalOf(t, err)
	if code != codes.ResourceExhausted || r != latchkeyv1.Reason_UNAVAILABLE || detail != "verifier busy: retry after the hint" {
		t.Fatalf("answer with every slot taken: %v %v %q, want RESOURCE_EXHAUSTED and the hint", code, r, detail)
	}
	// The join was admitted once: its end is audited like any other.
	waitLog(t, e, `result=failed reason=UNAVAILABLE policy=sha256:test`)
}
