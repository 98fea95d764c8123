package framelog

import (
	"encoding/binary"
	"errors"
)

// Payload encoding helpers shared by the logs: fields are varints (zig-zag for signed), single
// bytes and strings (uvarint length + bytes), as in the Kafka record format.

// AppendStr appends s as uvarint length + bytes.
func AppendStr(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// Reader decodes a payload field by field. The first malformation latches Err (naming the field)
// and empties B, so a decoder can read a whole record and check Err once.
type Reader struct {
	B   []byte
	Err error
}

// Fail latches "what" as the error (if none yet) and drops the rest of the payload.
func (r *Reader) Fail(what string) {
	if r.Err == nil {
		r.Err = errors.New(what)
	}
	r.B = nil
}

// Uvarint reads an unsigned varint.
func (r *Reader) Uvarint(what string) uint64 {
	v, n := binary.Uvarint(r.B)
	if n <= 0 {
		r.Fail("bad " + what)
		return 0
	}
	r.B = r.B[n:]
	return v
}

// Varint reads a signed (zig-zag) varint.
func (r *Reader) Varint(what string) int64 {
	v, n := binary.Varint(r.B)
	if n <= 0 {
		r.Fail("bad " + what)
		return 0
	}
	r.B = r.B[n:]
	return v
}

// VarintIn reads a signed varint that must lie in [lo, hi] (the range of the field's type).
func (r *Reader) VarintIn(what string, lo, hi int64) int64 {
	v, n := binary.Varint(r.B)
	if n <= 0 || v < lo || v > hi {
		r.Fail("bad " + what)
		return 0
	}
	r.B = r.B[n:]
	return v
}

// Byte reads one byte.
func (r *Reader) Byte(what string) byte {
	if len(r.B) == 0 {
		r.Fail("missing " + what)
		return 0
	}
	c := r.B[0]
	r.B = r.B[1:]
	return c
}

// Str reads a uvarint-length string.
func (r *Reader) Str(what string) string {
	n, k := binary.Uvarint(r.B)
	if k <= 0 || n > uint64(len(r.B)-k) {
		r.Fail("bad " + what + " length")
		return ""
	}
	s := string(r.B[k : k+int(n)])
	r.B = r.B[k+int(n):]
	return s
}

// Count reads a list length, which cannot exceed the bytes left (each element takes at least
// one), so a damaged count cannot make a decoder allocate more than the payload's size.
func (r *Reader) Count(what string) int {
	n := r.Uvarint(what)
	if n > uint64(len(r.B)) {
		r.Fail("bad " + what)
		return 0
	}
	return int(n)
}
