package server

import (
	"strconv"
	"sync"
	"sync/atomic"
	"unicode/utf8"

	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	protoenc "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// utf8Codec is gRPC's proto codec, except that a request whose string field
// holds invalid UTF-8 (which proto3 refuses to decode, and gRPC then
// answers INTERNAL) is decoded as an empty message and remembered with the
// path of the offending field; the interceptors answer it InvalidArgument
// naming that field before any handler sees it. A request that is no
// valid protobuf at all is remembered and answered InvalidArgument the
// same way. Each node has its own.
//
// It is hand-written because the schema cannot say it: a string field opts
// out of decode-time validation only with protobuf editions
// (features.utf8_validation = NONE), which need protoc 27 or later, and the
// protoc this project generates with (Debian's) is 3.21. With editions the
// fields would decode and the handlers could name the field themselves;
// the wire format would not change.
type utf8Codec struct {
	encoding.CodecV2
	// bad maps a request message to the field that held invalid UTF-8;
	// pending counts its entries, so that the interceptors look it up only
	// when there is one.
	bad     sync.Map
	pending atomic.Int64
}

func newUTF8Codec() *utf8Codec { return &utf8Codec{CodecV2: encoding.GetCodecV2(protoenc.Name)} }

// Marshal sends a view encoded once per publication as it is (see
// encodedView); anything else goes to the proto codec.
func (c *utf8Codec) Marshal(v any) (mem.BufferSlice, error) {
	if e, ok := v.(*encodedView); ok && e.wire != nil {
		return mem.BufferSlice{mem.SliceBuffer(e.wire)}, nil
	}
	return c.CodecV2.Marshal(v)
}

// Unmarshal implements encoding.CodecV2.
func (c *utf8Codec) Unmarshal(data mem.BufferSlice, v any) error {
	err := c.CodecV2.Unmarshal(data, v)
	if err == nil {
		return nil
	}
	m, ok := v.(proto.Message)
	if !ok {
		return err
	}
	// gRPC answers any decoding error INTERNAL: remember why instead, and
	// let the interceptors answer InvalidArgument.
	var bad error
	if field := invalidUTF8Field(data.Materialize(), m.ProtoReflect().Descriptor(), ""); field != "" {
		bad = failf(ErrBadRequest, "%s is not valid UTF-8", field)
	} else {
		bad = failf(ErrBadRequest, "the request is not a valid %s message: %v", m.ProtoReflect().Descriptor().FullName(), err)
	}
	proto.Reset(m)
	c.bad.Store(m, bad)
	c.pending.Add(1)
	return nil
}

// take returns the error (ErrBadRequest) of a request that did not
// decode (invalid UTF-8 or malformed protobuf), or nil, forgetting it.
func (c *utf8Codec) take(req any) error {
	if c.pending.Load() == 0 || req == nil {
		return nil
	}
	bad, ok := c.bad.LoadAndDelete(req)
	if !ok {
		return nil
	}
	c.pending.Add(-1)
	return bad.(error)
}

// invalidUTF8Field walks the wire form b of a message of descriptor d and
// returns the path of its first string field that is not valid UTF-8
// ("requests[2].key"), or "".
func invalidUTF8Field(b []byte, d protoreflect.MessageDescriptor, prefix string) string {
	seen := map[protowire.Number]int{}
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return ""
		}
		b = b[n:]
		fd := d.Fields().ByNumber(num)
		if typ != protowire.BytesType || fd == nil {
			if n = protowire.ConsumeFieldValue(num, typ, b); n < 0 {
				return ""
			}
			b = b[n:]
			continue
		}
		v, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return ""
		}
		b = b[n:]
		name := prefix + string(fd.Name())
		if fd.IsList() {
			name += "[" + strconv.Itoa(seen[num]) + "]"
			seen[num]++
		}
		switch fd.Kind() {
		case protoreflect.StringKind:
			if !utf8.Valid(v) {
				return name
			}
		case protoreflect.MessageKind, protoreflect.GroupKind:
			if f := invalidUTF8Field(v, fd.Message(), name+"."); f != "" {
				return f
			}
		}
	}
	return ""
}

// utf8Stream answers a streamed request with invalid UTF-8 InvalidArgument.
type utf8Stream struct {
	grpc.ServerStream
	codec *utf8Codec
}

// RecvMsg implements grpc.ServerStream.
func (s utf8Stream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	return toError(s.codec.take(m))
}
