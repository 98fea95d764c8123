// Package framelog is the framed durable-log primitive shared by kaas's append-only files: the
// transaction journal (coord/txn), the committed-offset log (storage.GroupStore) and the
// write-ahead log (storage, which keeps its own round writer but frames, checks and scans its
// records here). The ACL, credential and assignment stores are meant to use it as well.
//
// A log is a sequence of frames. A frame is a fixed-size header followed by a payload:
//
//	[magic u32] ... len u32 ... crc32c u32 ... | payload[len] | zero padding to Align
//
// Where the fields sit inside the header is a property of the Format, because the three
// existing on-disk layouts differ and none of them may change (files written before this
// package existed must still be read):
//
//	journal (txn)   len u32 | crc u32 | payload                     crc over the payload
//	offsets.log     magic "KGOF" | len u32 | crc u32 | payload      crc over the payload
//	WAL             magic "KWAL" | crc u32 | seq, round, topic id,  crc over header[8:] and the
//	                partition | len u32 | base offset | payload    payload; 8-byte aligned
//
// All integers are big-endian (the Kafka wire order), every checksum is CRC32C (Castagnoli,
// the checksum of Kafka record batches) through the one table below.
//
// The scanner (scan.go) walks a file front to back and classifies where the valid data stops,
// the appender (append.go) writes and syncs frames and repairs the file after a failed write,
// and Reader / AppendStr (reader.go) encode and decode payload fields.
//
// A new log (ACLs, credentials, assignments) needs only its payload codec:
//
//	var aclFormat = framelog.Format{Magic: ..., HeaderLen: 12, LenAt: 4, CRCAt: 8, MaxLen: 16 << 20}
//
//	// open: replay, then cut a torn tail; refuse damage inside acknowledged data
//	sc := framelog.Scanner{Format: &aclFormat, Frame: func(pos int, p []byte) (bool, error) {
//		return true, apply(p) // one frame per Append: every frame is a unit
//	}}
//	res, err := sc.Scan(data, headerLen)
//	// res.Damaged → refuse to start; res.Torn → truncate to res.End and fsync
//
//	// write: one write + one sync per call; refuse what the reader would refuse
//	app := framelog.NewAppender(file, &aclFormat, res.End, 0)
//	err = app.Append(payload) // framelog.ErrFrameTooLarge past MaxLen
//
// Without a batch number in the payload, write one frame per Append call: the scanner can then
// tell a torn last write (nothing valid after it) from damage (a valid frame after it). A log
// that writes several frames per call marks each call's last frame (Frame's commit) and tells
// the scanner, through Follow, which later frames belong to the unfinished call.
package framelog

import (
	"bytes"
	"encoding/binary"
	"hash/crc32"
)

// Castagnoli is the one CRC32C table of the storage layer.
var Castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Checksum is crc32c(b).
func Checksum(b []byte) uint32 { return crc32.Checksum(b, Castagnoli) }

// Format describes one on-disk frame layout. The zero value is not usable: HeaderLen must hold
// the length and checksum fields (and the magic, if any).
type Format struct {
	// Magic, if non-zero, is the frame's first 4 bytes. A reader looking for the next frame after
	// damage only has to look at positions holding it.
	Magic uint32
	// HeaderLen is the number of bytes before the payload.
	HeaderLen int
	// LenAt and CRCAt are the header offsets of the payload length and of the checksum.
	LenAt, CRCAt int
	// CRCFrom is where the checksum starts: it covers frame[CRCFrom : HeaderLen+len]. Zero means
	// HeaderLen (the payload only).
	CRCFrom int
	// Align, if > 1, pads every frame with zeros to a multiple of it; frames then start only at
	// multiples of it (relative to the start of the data).
	Align int
	// MinLen and MaxLen bound the payload length a reader accepts. MaxLen is also what a writer
	// must refuse to exceed (Fits): a frame written larger than the reader's limit would be
	// acknowledged and then read back as damage.
	MinLen, MaxLen int
	// Plausible, if set, is an extra check on a frame whose length fits, run before the
	// checksum (cheap filters: a record type byte, a generation number in the header).
	Plausible func(frame []byte) bool
	// Prezeroed: the file is zero-filled ahead of the write position, so a zero length field
	// (or a short, all-zero tail) is the clean end of the log rather than damage.
	Prezeroed bool
	// Filler, if set, replaces the Prezeroed rule: it reports whether the bytes at the point
	// where frames stop (not a valid frame, never empty) are filler that ends the log cleanly,
	// e.g. an earlier life of a recycled file. Without either, any byte there is damage.
	Filler func(rest []byte) bool
}

// Size is the on-disk size of a frame with an n-byte payload (padding included).
func (f *Format) Size(n int) int {
	s := f.HeaderLen + n
	if f.Align > 1 {
		s = (s + f.Align - 1) &^ (f.Align - 1)
	}
	return s
}

// Fits reports whether an n-byte payload is within what the reader accepts.
func (f *Format) Fits(n int) bool { return n >= f.MinLen && n <= f.MaxLen }

var zeroHeader [256]byte

// Begin reserves a header at the end of b; append the payload (and fill format-specific header
// fields at b[start:]) and then call End or EndUnsealed with start.
func (f *Format) Begin(b []byte) (_ []byte, start int) {
	start = len(b)
	return append(b, zeroHeader[:f.HeaderLen]...), start
}

// End completes the frame that Begin started at start: magic, length, padding and checksum.
func (f *Format) End(b []byte, start int) []byte {
	b = f.EndUnsealed(b, start)
	f.Seal(b[start:])
	return b
}

// EndUnsealed is End without the checksum, for a format whose checksummed header fields are
// only known later (the WAL stamps generation and round at flush time); call Seal then.
func (f *Format) EndUnsealed(b []byte, start int) []byte {
	n := len(b) - start - f.HeaderLen
	h := b[start:]
	if f.Magic != 0 {
		binary.BigEndian.PutUint32(h, f.Magic)
	}
	binary.BigEndian.PutUint32(h[f.LenAt:], uint32(n))
	if pad := f.Size(n) - f.HeaderLen - n; pad > 0 {
		b = append(b, zeroHeader[:pad]...)
	}
	return b
}

// Append appends a complete frame holding payload to b.
func (f *Format) Append(b, payload []byte) []byte {
	b, start := f.Begin(b)
	b = append(b, payload...)
	return f.End(b, start)
}

// Seal computes and stores the checksum of the frame at frame[0:] (its length field set). It
// returns the frame's on-disk size.
func (f *Format) Seal(frame []byte) int {
	n := int(binary.BigEndian.Uint32(frame[f.LenAt:]))
	binary.BigEndian.PutUint32(frame[f.CRCAt:], Checksum(frame[f.crcFrom():f.HeaderLen+n]))
	return f.Size(n)
}

func (f *Format) crcFrom() int {
	if f.CRCFrom == 0 {
		return f.HeaderLen
	}
	return f.CRCFrom
}

// Parse validates the frame at the start of b: magic, a length within [MinLen, MaxLen] that fits
// in b, Plausible, checksum. size is the frame's on-disk size; with Align it may reach past
// len(b) by the padding of a frame cut off at the end of the data.
func (f *Format) Parse(b []byte) (payload []byte, size int, ok bool) {
	if len(b) < f.HeaderLen || f.HeaderLen == 0 {
		return nil, 0, false
	}
	if f.Magic != 0 && binary.BigEndian.Uint32(b) != f.Magic {
		return nil, 0, false
	}
	l := binary.BigEndian.Uint32(b[f.LenAt:])
	if uint64(l) < uint64(f.MinLen) || uint64(l) > uint64(f.MaxLen) || uint64(l) > uint64(len(b)-f.HeaderLen) {
		return nil, 0, false
	}
	end := f.HeaderLen + int(l)
	if f.Plausible != nil && !f.Plausible(b[:end]) {
		return nil, 0, false
	}
	if Checksum(b[f.crcFrom():end]) != binary.BigEndian.Uint32(b[f.CRCAt:]) {
		return nil, 0, false
	}
	return b[f.HeaderLen:end], f.Size(int(l)), true
}

// Find returns the position of the first valid frame at or after from, or -1. With a magic only
// positions holding it are checked; without one, runs of zeros (a zero length field cannot start
// a frame of a Prezeroed log) are skipped without checksum work.
func (f *Format) Find(data []byte, from int) int {
	from = max(from, 0)
	if f.Align > 1 {
		from = (from + f.Align - 1) &^ (f.Align - 1)
	}
	if f.Magic != 0 {
		var m [4]byte
		binary.BigEndian.PutUint32(m[:], f.Magic)
		for from < len(data) {
			i := bytes.Index(data[from:], m[:])
			if i < 0 {
				return -1
			}
			p := from + i
			if f.Align > 1 && p%f.Align != 0 {
				from = p + 1
				continue
			}
			if _, _, ok := f.Parse(data[p:]); ok {
				return p
			}
			from = p + 1
		}
		return -1
	}
	step := max(f.Align, 1)
	for p := from; p+f.HeaderLen <= len(data); {
		if f.Prezeroed && binary.BigEndian.Uint32(data[p+f.LenAt:]) == 0 {
			i := IndexNonZero(data[p+f.LenAt:])
			if i < 0 {
				return -1
			}
			// The length field of a frame may start up to 3 bytes before its first non-zero byte.
			next := p + i - 3
			if step > 1 {
				next = (next + step - 1) &^ (step - 1)
			}
			p = max(p+step, next)
			continue
		}
		if _, _, ok := f.Parse(data[p:]); ok {
			return p
		}
		p += step
	}
	return -1
}

// IndexNonZero returns the index of the first non-zero byte of b, or -1.
func IndexNonZero(b []byte) int {
	i := 0
	for ; i+8 <= len(b); i += 8 {
		if binary.LittleEndian.Uint64(b[i:]) != 0 {
			break
		}
	}
	for ; i < len(b); i++ {
		if b[i] != 0 {
			return i
		}
	}
	return -1
}

// isFiller applies the Filler / Prezeroed rule to the non-empty bytes at a stop.
func (f *Format) isFiller(rest []byte) bool {
	switch {
	case f.Filler != nil:
		return f.Filler(rest)
	case !f.Prezeroed:
		return false
	case len(rest) < f.HeaderLen:
		return IndexNonZero(rest) < 0
	default:
		return binary.BigEndian.Uint32(rest[f.LenAt:]) == 0
	}
}
