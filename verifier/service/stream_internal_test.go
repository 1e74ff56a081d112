package service

import (
	"context"
	"errors"
	"io"
	"sync/atomic"
	"testing"

	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

// scriptedStream is a join stream whose Recv returns what the test feeds
// it, counting Recvs that run at once.
type scriptedStream struct {
	latchkeyv1.JoinService_JoinServer
	ctx              context.Context
	feed             chan *latchkeyv1.AgentMessage
	running, maxSeen atomic.Int32
}

func (s *scriptedStream) Context() context.Context { return s.ctx }

func (s *scriptedStream) Recv() (*latchkeyv1.AgentMessage, error) {
	n := s.running.Add(1)
	defer s.running.Add(-1)
	for {
		m := s.maxSeen.Load()
		if n <= m || s.maxSeen.CompareAndSwap(m, n) {
			break
		}
	}
	select {
	case m := <-s.feed:
		return m, nil
	case <-s.ctx.Done():
		return nil, io.EOF
	}
}

func ackMessage() *latchkeyv1.AgentMessage {
	return &latchkeyv1.AgentMessage{Msg: &latchkeyv1.AgentMessage_TicketAck{TicketAck: &latchkeyv1.TicketAck{}}}
}

// A wait that gave up (its context ended) leaves the message that arrives
// afterwards to the next wait: with a reader per wait, the abandoned
// reader took it and the next wait started a second Recv on the stream.
func TestRecvAfterAbandonedWaitGetsTheMessage(t *testing.T) {
	sctx, end := context.WithCancel(context.Background())
	defer end()
	fake := &scriptedStream{ctx: sctx, feed: make(chan *latchkeyv1.AgentMessage)}
	stream := newJoinStream(fake)

	gone, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := recv(gone, stream); !errors.Is(err, context.Canceled) {
		t.Fatalf("recv on an ended context = %v, want context.Canceled", err)
	}
	fake.feed <- ackMessage()
	m, err := recv(context.Background(), stream)
	if err != nil || m.GetTicketAck() == nil {
		t.Fatalf("recv after the abandoned wait = %v, %v; want the TicketAck", m, err)
	}
	fake.feed <- ackMessage()
	if m, err := recv(context.Background(), stream); err != nil || m.GetTicketAck() == nil {
		t.Fatalf("second recv = %v, %v; want the TicketAck", m, err)
	}
	if n := fake.maxSeen.Load(); n != 1 {
		t.Fatalf("%d Recvs ran at once on the stream, want 1", n)
	}
	// The stream's end (the handler returned) ends the reader: the next
	// wait sees the stream's error, not a hang.
	end()
	if _, err := recv(context.Background(), stream); !errors.Is(err, io.EOF) {
		t.Fatalf("recv after the stream ended = %v, want io.EOF", err)
	}
}
