package service

import (
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/latchkey/latchkey/attest"
	latchkeyv1 "github.com/latchkey/latchkey/proto/latchkey/v1"
)

// Transport refusals with honest reasons. When grpc-go itself fails to
// read a message (undecodable protobuf, invalid UTF-8 in a string, a
// message over the receive limit) it ends the stream with its own status,
// before the handler can answer: the agent gets no Refusal and the audit
// said UNAVAILABLE. The join service's codec therefore never fails to
// decode an AgentMessage: it hands the handler an empty message marked
// with why it could not be read, and recv turns the mark into a MALFORMED
// refusal.
//
// The size limit works the same way within transportSlack above
// MaxMessageSize: grpc's own receive limit is MaxMessageSize +
// transportSlack (so grpc still refuses, without reading it, anything
// larger), and the codec refuses a message between the two as MALFORMED.

// transportSlack is how far above MaxMessageSize a message is still read
// so that its refusal can carry a reason.
const transportSlack = 64 << 10

// grpcRecvLimit is the gRPC receive limit of the join port.
const grpcRecvLimit = MaxMessageSize + transportSlack

// markField is the field number of the mark: the largest valid one,
// unused by AgentMessage. A client sending it only gets itself refused.
const markField protowire.Number = protowire.MaxValidNumber

// Causes the mark carries.
const (
	markUndecodable = 1
	markOversized   = 2
)

// joinCodec is the proto codec, except that an AgentMessage that cannot
// be read is marked instead of failing the stream.
type joinCodec struct{ proto encoding.CodecV2 }

func newJoinCodec() encoding.CodecV2 {
	return joinCodec{proto: encoding.GetCodecV2("proto")}
}

func (c joinCodec) Name() string { return c.proto.Name() }

func (c joinCodec) Marshal(v any) (mem.BufferSlice, error) { return c.proto.Marshal(v) }

func (c joinCodec) Unmarshal(data mem.BufferSlice, v any) error {
	m, ok := v.(*latchkeyv1.AgentMessage)
	if !ok {
		return c.proto.Unmarshal(data, v)
	}
	n := data.Len()
	if n > MaxMessageSize {
		mark(m, markOversized, n)
		return nil
	}
	buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
	defer buf.Free()
	if err := proto.Unmarshal(buf.ReadOnlyData(), m); err != nil {
		mark(m, markUndecodable, n)
	}
	return nil
}

func mark(m *latchkeyv1.AgentMessage, cause, size int) {
	proto.Reset(m)
	b := protowire.AppendTag(nil, markField, protowire.BytesType)
	inner := protowire.AppendVarint(protowire.AppendVarint(nil, uint64(cause)), uint64(size))
	m.ProtoReflect().SetUnknown(protowire.AppendBytes(b, inner))
}

// transportRefusal is the MALFORMED refusal of a marked message, nil for
// a message that was read.
func transportRefusal(m *latchkeyv1.AgentMessage) error {
	u := m.ProtoReflect().GetUnknown()
	for len(u) > 0 {
		num, typ, n := protowire.ConsumeTag(u)
		if n < 0 {
			return nil
		}
		u = u[n:]
		if num != markField || typ != protowire.BytesType {
			if n = protowire.ConsumeFieldValue(num, typ, u); n < 0 {
				return nil
			}
			u = u[n:]
			continue
		}
		inner, n := protowire.ConsumeBytes(u)
		if n < 0 {
			return nil
		}
		cause, k := protowire.ConsumeVarint(inner)
		if k < 0 {
			return nil
		}
		size, _ := protowire.ConsumeVarint(inner[k:])
		return markRefusal(cause, size)
	}
	return nil
}

func markRefusal(cause, size uint64) error {
	switch cause {
	case markOversized:
		return attest.Refuse(latchkeyv1.Reason_MALFORMED, "message is %d bytes, limit %d", size, MaxMessageSize)
	case markUndecodable:
		return attest.Refuse(latchkeyv1.Reason_MALFORMED, "message of %d bytes is not a valid AgentMessage (protobuf or UTF-8)", size)
	}
	return attest.Refuse(latchkeyv1.Reason_MALFORMED, "message carries reserved field %d", markField)
}
