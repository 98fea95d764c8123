package codec

import (
	"encoding/binary"
	"errors"
)

// Request header rules (KIP-482):
//   - header v1: int16 key, int16 version, int32 correlation id, nullable int16-length client id;
//   - header v2 (flexible request versions) appends a tagged-field section; the client id stays a
//     non-compact string;
//   - ControlledShutdown v0 (key 7) uses header v0, which has no client id at all.
// Responses use header v0 (correlation id only) or v1 (plus one tagged-field section) when the
// response is flexible, except ApiVersions, which always answers with header v0 so a client that
// does not yet know our versions can parse it.

// Sentinel errors of the wire layer; every one of them means "close the connection".
var (
	ErrTruncated          = errors.New("truncated request")
	ErrUnknownKey         = errors.New("unknown api key")
	ErrUnsupportedVersion = errors.New("unsupported api version")
	ErrTrailingBytes      = errors.New("trailing bytes after request body")
)

// RequestHeader is a parsed request header.
type RequestHeader struct {
	Key           int16
	Version       int16
	CorrelationID int32
	ClientID      *string
}

// PeekHeader reads key, version and correlation id without interpreting anything else. It is
// used to answer requests whose body cannot be parsed (unsupported ApiVersions versions).
func PeekHeader(frame []byte) (key, version int16, corr int32, err error) {
	if len(frame) < 8 {
		return 0, 0, 0, ErrTruncated
	}
	return int16(binary.BigEndian.Uint16(frame)), int16(binary.BigEndian.Uint16(frame[2:])),
		int32(binary.BigEndian.Uint32(frame[4:])), nil
}

// parseHeaderRest reads the client id and (if flexible) the header's tagged fields, returning the
// remaining body.
func parseHeaderRest(h *RequestHeader, b []byte, flexible bool) ([]byte, error) {
	if !(h.Key == 7 && h.Version == 0) { // ControlledShutdown v0 has no client id
		if len(b) < 2 {
			return nil, ErrTruncated
		}
		n := int16(binary.BigEndian.Uint16(b))
		b = b[2:]
		if n >= 0 {
			if len(b) < int(n) {
				return nil, ErrTruncated
			}
			s := string(b[:n])
			h.ClientID = &s
			b = b[n:]
		} else if n != -1 {
			return nil, ErrTruncated
		}
	}
	if flexible {
		var err error
		if b, err = SkipTags(b); err != nil {
			return nil, err
		}
	}
	return b, nil
}

// SkipTags skips a tagged-field section (uvarint count, then per field uvarint tag, uvarint size,
// bytes) and returns what follows.
func SkipTags(b []byte) ([]byte, error) {
	n, k := binary.Uvarint(b)
	if k <= 0 {
		return nil, ErrTruncated
	}
	b = b[k:]
	for ; n > 0; n-- {
		_, k = binary.Uvarint(b) // tag
		if k <= 0 {
			return nil, ErrTruncated
		}
		b = b[k:]
		size, k := binary.Uvarint(b)
		if k <= 0 || uint64(len(b)-k) < size {
			return nil, ErrTruncated
		}
		b = b[k+int(size):]
	}
	return b, nil
}
