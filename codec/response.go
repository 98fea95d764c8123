package codec

import (
	"encoding/binary"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// AppendResponse appends a complete response frame (size prefix, header, body) to dst.
// ApiVersions always uses response header v0 (KIP-511); other flexible responses carry an empty
// tagged-field section in the header.
func AppendResponse(dst []byte, corr int32, resp kmsg.Response) []byte {
	start := len(dst)
	dst = append(dst, 0, 0, 0, 0)
	dst = binary.BigEndian.AppendUint32(dst, uint32(corr))
	if resp.IsFlexible() && resp.Key() != 18 {
		dst = append(dst, 0)
	}
	dst = resp.AppendTo(dst)
	binary.BigEndian.PutUint32(dst[start:], uint32(len(dst)-start-4))
	return dst
}

// ApiVersionsFallback builds the KIP-511 answer to an ApiVersions request at a version we do not
// serve: a v0 response with UNSUPPORTED_VERSION whose key list holds only ApiVersions itself, as
// Apache's ApiVersionsRequest.getErrorResponse does, so the client retries at the highest
// ApiVersions version we serve. A full key list would be taken as the final answer (franz-go
// uses it as is), and a v0 answer carries no features: the client would never see the
// finalized transaction.version and would run TV1 forever.
func ApiVersionsFallback() *kmsg.ApiVersionsResponse {
	resp := kmsg.NewPtrApiVersionsResponse()
	resp.Version = 0
	resp.ErrorCode = CodeUnsupportedVersion
	for _, r := range Registered() {
		if r.Key != int16(kmsg.ApiVersions) {
			continue
		}
		k := kmsg.NewApiVersionsResponseApiKey()
		k.ApiKey, k.MinVersion, k.MaxVersion = r.Key, r.Min, r.Max
		resp.ApiKeys = append(resp.ApiKeys, k)
	}
	return resp
}
