package codec

import (
	"fmt"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// Request is one decoded request. Msg's []byte fields alias the frame it was parsed from (kmsg
// ReadFrom semantics), so the frame must stay owned by the caller while Msg is in use.
type Request struct {
	Header RequestHeader
	Msg    kmsg.Request
}

// ParseRequest decodes a whole frame (the 4-byte size prefix already stripped).
//
// Errors: ErrUnknownKey for a key kmsg does not know or we do not serve, ErrUnsupportedVersion for a
// version outside the registered range (the caller answers ApiVersions specially, KIP-511, and
// closes the connection for anything else), ErrTruncated / a kmsg error for a malformed body.
func ParseRequest(frame []byte) (*Request, error) {
	key, version, corr, err := PeekHeader(frame)
	if err != nil {
		return nil, err
	}
	r := &Request{Header: RequestHeader{Key: key, Version: version, CorrelationID: corr}}
	msg := kmsg.RequestForKey(key)
	if msg == nil {
		return r, ErrUnknownKey
	}
	rng, ok := Lookup(key)
	if !ok {
		return r, ErrUnknownKey
	}
	if version < rng.Min || version > rng.Max || version > msg.MaxVersion() {
		return r, ErrUnsupportedVersion
	}
	msg.SetVersion(version)
	body, err := parseHeaderRest(&r.Header, frame[8:], msg.IsFlexible())
	if err != nil {
		return r, err
	}
	if err := msg.ReadFrom(body); err != nil {
		return r, fmt.Errorf("cannot decode %s v%d body: %w", kmsg.NameForKey(key), version, err)
	}
	r.Msg = msg
	return r, nil
}
