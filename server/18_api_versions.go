package server

// ApiVersions: v0-4
//
// Behavior:
//   - The key list is generated from the handlers' register() calls (codec registry): we only ever
//     advertise what a handler serves.
//   - A request at a version above ours never reaches here: the server answers it at v0 with
//     UNSUPPORTED_VERSION and our key list (KIP-511), see Server.parseFailed.
//   - v3+: ClientSoftwareName/Version must match Kafka's pattern, else INVALID_REQUEST.
//   - v3+: SupportedFeatures / FinalizedFeatures carry transaction.version once transactions are
//     served; a Java 4.x client runs KIP-890 "transactions v2" only when the finalized level is
//     >= 2. Versions 0-3 of the response must not list features whose minimum is 0
//     (KAFKA-17011: older clients reject them), v4 may.
//
// Version notes:
//   - v3: flexible, client software name/version, features (tagged)
//   - v4: min-version-0 features allowed

import (
	"regexp"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kaas-go/kaas/codec"
)

func init() { register(kmsg.ApiVersions, 0, 4, handleApiVersions) }

var softwareRe = regexp.MustCompile(`^[a-zA-Z0-9](?:[a-zA-Z0-9\-.]*[a-zA-Z0-9])?$`)

// feature is one KIP-584 feature flag this broker supports and has finalized.
type feature struct {
	name          string
	min, max      int16
	finalized     int16
	finalizeEpoch int64
}

// features returns the feature flags advertised in ApiVersions. transactionVersionServed is the
// highest transaction.version the transaction coordinator implements; the configured
// transaction.version is clamped to it so we never finalize a level we do not serve.
func (s *Server) features() []feature {
	served := transactionVersionServed
	if served == 0 {
		return nil
	}
	fin := s.cfg.TransactionVersion
	if fin > served {
		fin = served
	}
	epoch := s.deps.FeaturesEpoch
	if epoch < 1 {
		epoch = 1 // a server built without StartBroker (tests): nothing persisted
	}
	return []feature{{name: "transaction.version", min: 0, max: served, finalized: fin, finalizeEpoch: epoch}}
}

// transactionVersionServed is the highest transaction.version served: 2 = KIP-890 part 2 (Produce
// v12 implicit add, EndTxn v5 epoch bump per transaction). cfg.TransactionVersion finalizes a
// lower level (1) so clients run the TV1 protocol; the coordinator still keys every request on its
// version, as Apache does.
const transactionVersionServed int16 = 2

func handleApiVersions(rc *reqCtx) (kmsg.Response, error) {
	req := rc.req.(*kmsg.ApiVersionsRequest)
	resp := req.ResponseKind().(*kmsg.ApiVersionsResponse)
	if req.Version >= 3 && (!softwareRe.MatchString(req.ClientSoftwareName) || !softwareRe.MatchString(req.ClientSoftwareVersion)) {
		resp.ErrorCode = codec.CodeInvalidRequest
	}
	for _, r := range codec.Registered() {
		k := kmsg.NewApiVersionsResponseApiKey()
		k.ApiKey, k.MinVersion, k.MaxVersion = r.Key, r.Min, r.Max
		resp.ApiKeys = append(resp.ApiKeys, k)
	}
	if req.Version >= 3 {
		resp.FinalizedFeaturesEpoch = -1
		for _, f := range rc.s.features() {
			if f.min > 0 || req.Version >= 4 {
				sf := kmsg.NewApiVersionsResponseSupportedFeature()
				sf.Name, sf.MinVersion, sf.MaxVersion = f.name, f.min, f.max
				resp.SupportedFeatures = append(resp.SupportedFeatures, sf)
			}
			ff := kmsg.NewApiVersionsResponseFinalizedFeature()
			ff.Name, ff.MinVersionLevel, ff.MaxVersionLevel = f.name, f.finalized, f.finalized
			resp.FinalizedFeatures = append(resp.FinalizedFeatures, ff)
			resp.FinalizedFeaturesEpoch = f.finalizeEpoch
		}
	}
	return resp, nil
}
