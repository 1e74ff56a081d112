package service_test

import (
	"bytes"
	"context"
	"strconv"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/latchkey/latchkey/attest/atls"
	"github.com/latchkey/latchkey/attest/attesttest"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
	"github.com/latchkey/latchkey/verifier/binding"
	"github.com/latchkey/latchkey/verifier/metrics"
	"github.com/latchkey/latchkey/verifier/service"
)

// rawBytes is a client codec that sends bytes as they are, for messages
// a protobuf encoder would never produce.
type rawBytes struct{}

func (rawBytes) Name() string { return "proto" }
func (rawBytes) Marshal(v any) ([]byte, error) {
	return v.([]byte), nil
}
func (rawBytes) Unmarshal(data []byte, v any) error {
	*(v.(*[]byte)) = append([]byte(nil), data...)
	return nil
}

// sendRaw opens a Join stream, sends b as the first message and returns
// the error the stream ends with.
func sendRaw(t *testing.T, e *env, b []byte) error {
	t.Helper()
	cfg, _ := atls.ClientConfig([]atls.Pin{e.pin}, false)
	conn, err := grpc.NewClient("passthrough:///"+e.addr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)),
		grpc.WithDisableRetry(), grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(8<<20)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	s, err := conn.NewStream(context.Background(), &grpc.StreamDesc{ClientStreams: true, ServerStreams: true},
		"/latchkey.v1.JoinService/Join", grpc.ForceCodec(rawBytes{}))
	if err != nil {
		t.Fatal(err)
	}
	s.SendMsg(b)
	var out []byte
	return s.RecvMsg(&out)
}

// refusalOf is the status code, Refusal reason and detail of err.
func refusalOf(t *testing.T, err error) (codes.Code, latchkeyv1.Reason, string) {
	t.Helper()
	st, _ := status.FromError(err)
	for _, d := range st.Details() {
		if r, ok := d.(*latchkeyv1.Refusal); ok {
			return st.Code(), r.GetReason(), r.GetDetail()
		}
	}
	t.Fatalf("status %v carries no Refusal", err)
	return 0, 0, ""
}

// Messages grpc cannot read are MALFORMED with a Refusal naming why, not
// a bare transport status; they are counted, not audited.
func TestTransportRefusalsAreMalformed(t *testing.T) {
	okHello, err := proto.Marshal(helloMsg(&latchkeyv1.Hello{NodeName: "QQQQ", DiskUuid: diskA, Role: 1, Variant: 1, Evidence: []byte("x")}))
	if err != nil {
		t.Fatal(err)
	}
	badUTF8 := bytes.Replace(okHello, []byte("QQQQ"), []byte{0xff, 0xfe, 0xfd, 0xfc}, 1)
	big := bytes.Repeat([]byte{0}, service.MaxMessageSize+1)
	for name, c := range map[string]struct {
		msg    []byte
		detail string
	}{
		"undecodable protobuf": {[]byte{0xff, 0xff, 0xff}, "message of 3 bytes is not a valid AgentMessage (protobuf or UTF-8)"},
		"invalid utf-8":        {badUTF8, "message of " + itoa(len(badUTF8)) + " bytes is not a valid AgentMessage (protobuf or UTF-8)"},
		"over the limit":       {big, "message is " + itoa(len(big)) + " bytes, limit " + itoa(service.MaxMessageSize)},
	} {
		t.Run(name, func(t *testing.T) {
			m := metrics.New()
			e := startVerifier(t, envOpt{metrics: m})
			code, reason, detail := refusalOf(t, sendRaw(t, e, c.msg))
			if code != codes.InvalidArgument || reason != latchkeyv1.Reason_MALFORMED || detail != c.detail {
				t.Fatalf("got %v %v %q, want InvalidArgument MALFORMED %q", code, reason, detail, c.detail)
			}
			if got := sample(t, m, "latchkey_verifier_streams_without_hello_total", "cause=malformed"); got != 1 {
				t.Fatalf("streams_without_hello_total{malformed} = %v, want 1", got)
			}
			if strings.Contains(e.logs.String(), "join decision") {
				t.Fatalf("a stream without a Hello was audited:\n%s", e.logs)
			}
		})
	}
}

// Far past the limit grpc still refuses without reading the message
// (bounded memory); that refusal stays grpc's own.
func TestHugeMessageRefusedUnread(t *testing.T) {
	e := startVerifier(t, envOpt{})
	err := sendRaw(t, e, bytes.Repeat([]byte{0}, 2*service.MaxMessageSize))
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("err = %v, want ResourceExhausted", err)
	}
}

// A half-close before the Hello is MALFORMED (the agent ended a join it
// never started), counted, not audited.
func TestHalfCloseBeforeHelloIsMalformed(t *testing.T) {
	m := metrics.New()
	e := startVerifier(t, envOpt{metrics: m})
	s := rawStream(t, e)
	s.CloseSend()
	_, err := s.Recv()
	code, reason, detail := refusalOf(t, err)
	if code != codes.InvalidArgument || reason != latchkeyv1.Reason_MALFORMED || detail != "stream closed before a Hello" {
		t.Fatalf("got %v %v %q, want InvalidArgument MALFORMED 'stream closed before a Hello'", code, reason, detail)
	}
	if got := sample(t, m, "latchkey_verifier_streams_without_hello_total", "cause=closed"); got != 1 {
		t.Fatalf("streams_without_hello_total{closed} = %v, want 1", got)
	}
	if strings.Contains(e.logs.String(), "join decision") {
		t.Fatalf("audited:\n%s", e.logs)
	}
}

// The cause of a verifier-side failure (the API server's error, with its
// addresses) stays in the verifier's log; the agent gets a stable detail.
func TestInternalCauseNotSentToAgent(t *testing.T) {
	e := startVerifier(t, envOpt{minter: &fakeMinter{}, store: func(s binding.Store) binding.Store { return &brokenStore{Store: s, get: true} }})
	s := rawStream(t, e)
	h := baseHello()
	h.Evidence = fakeEvidence(t, bindingOf(t, s, h))
	s.Send(helloMsg(h))
	_, err := s.Recv()
	code, reason, detail := refusalOf(t, err)
	const want = "disk binding record: verifier-side failure (cause in the verifier log)"
	if code != codes.Unavailable || reason != latchkeyv1.Reason_UNAVAILABLE || detail != want {
		t.Fatalf("got %v %v %q, want Unavailable UNAVAILABLE %q", code, reason, detail, want)
	}
	if strings.Contains(err.Error(), errStoreDown.Error()) {
		t.Fatalf("the agent was told the internal cause: %v", err)
	}
	if !strings.Contains(e.logs.String(), errStoreDown.Error()) {
		t.Fatalf("the verifier log lost the cause:\n%s", e.logs)
	}
}

// The audit line names every field known: request_token always, and the
// node and disk of a Hello refused by validation (cut to a bound).
func TestAuditHasEveryKnownField(t *testing.T) {
	e := startVerifier(t, envOpt{minter: &fakeMinter{}})
	req := worker(diskA)
	req.RequestToken = true
	if _, err := client(t, e, &attesttest.Issuer{}).Get(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(e.logs.String(), "request_token=true") {
		t.Fatalf("no request_token in the audit line:\n%s", e.logs)
	}
	s := rawStream(t, e)
	long := strings.Repeat("a", 300)
	s.Send(helloMsg(&latchkeyv1.Hello{NodeName: "Node_1!", DiskUuid: long, Role: 1, Variant: 1, RequestToken: true, Evidence: []byte("x")}))
	_, err := s.Recv()
	if _, reason, _ := refusalOf(t, err); reason != latchkeyv1.Reason_MALFORMED {
		t.Fatalf("reason %v, want MALFORMED", reason)
	}
	var line string
	for _, l := range strings.Split(e.logs.String(), "\n") {
		if strings.Contains(l, "reason=MALFORMED") {
			line = l
		}
	}
	for _, want := range []string{`node=Node_1!`, "disk_uuid=" + strings.Repeat("a", 64) + "...", "request_token=true", "role=ROLE_WORKER", "variant=VARIANT_TPM"} {
		if !strings.Contains(line, want) {
			t.Fatalf("audit line %q lacks %q", line, want)
		}
	}
}

func itoa(n int) string { return strconv.Itoa(n) }
