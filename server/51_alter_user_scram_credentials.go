package server

// AlterUserScramCredentials (KIP-554), what `kafka-configs --alter --add-config
// 'SCRAM-SHA-256=[iterations=8192,password=…]' --entity-type users` sends: the client draws the
// salt and computes SaltedPassword = Hi(password, salt, iterations) itself, so the password never
// reaches the broker; the broker derives StoredKey and ServerKey and stores those.
//
// Results are per user, in the order users first appear. Apache's checks, in order, each failing
// every change of that user: ALTER on the cluster (31); the same (user, mechanism) twice in the
// request (92 DUPLICATE_RESOURCE); an empty user name (93 UNACCEPTABLE_CREDENTIAL); an unknown
// mechanism (33 UNSUPPORTED_SASL_MECHANISM); iterations outside [sasl.scram.min.iterations,
// 16384], or an empty salt / a salted password of the wrong length (93); deleting a credential
// that does not exist (91 RESOURCE_NOT_FOUND). A user's changes are applied together.

import (
	"errors"

	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"

	"github.com/kaas-go/kaas/codec"
	"github.com/kaas-go/kaas/coord/credentials"
)

func init() {
	register(kmsg.AlterUserSCRAMCredentials, 0, 0, handleAlterUserSCRAMCredentials)
}

func handleAlterUserSCRAMCredentials(rc *reqCtx) (kmsg.Response, error) {
	req := rc.req.(*kmsg.AlterUserSCRAMCredentialsRequest)
	resp := req.ResponseKind().(*kmsg.AlterUserSCRAMCredentialsResponse)

	type userAlter struct {
		changes []credentials.Change
		code    int16
		msg     string
	}
	var order []string
	byUser := map[string]*userAlter{}
	seen := map[string]map[int8]int{}
	note := func(user string, mech int8) *userAlter {
		ua := byUser[user]
		if ua == nil {
			ua = &userAlter{}
			byUser[user] = ua
			order = append(order, user)
			seen[user] = map[int8]int{}
		}
		seen[user][mech]++
		return ua
	}
	fail := func(ua *userAlter, code int16, msg string) {
		if ua.code == codec.CodeNone {
			ua.code, ua.msg = code, msg
		}
	}
	check := func(ua *userAlter, user string, mech int8) bool {
		switch {
		case user == "":
			fail(ua, codec.CodeUnacceptableCredential, "Username must not be empty.")
		case !credentials.Mechanism(mech).Valid():
			fail(ua, codec.CodeUnsupportedSaslMechanism, "Unknown SCRAM mechanism.")
		default:
			return true
		}
		return false
	}
	for _, d := range req.Deletions {
		ua := note(d.Name, d.Mechanism)
		if check(ua, d.Name, d.Mechanism) {
			ua.changes = append(ua.changes, credentials.Change{User: d.Name, Mechanism: credentials.Mechanism(d.Mechanism), Delete: true})
		}
	}
	for _, u := range req.Upsertions {
		ua := note(u.Name, u.Mechanism)
		if !check(ua, u.Name, u.Mechanism) {
			continue
		}
		m := credentials.Mechanism(u.Mechanism)
		if err := credentials.CheckIterations(int(u.Iterations), rc.s.cfg.SCRAMMinIteration); err != nil {
			fail(ua, codec.CodeUnacceptableCredential, "Iterations must be between sasl.scram.min.iterations and 16384.")
			continue
		}
		if len(u.Salt) == 0 || len(u.SaltedPassword) != hashLen(m) {
			fail(ua, codec.CodeUnacceptableCredential, "Salt must not be empty and the salted password must be one hash long.")
			continue
		}
		ua.changes = append(ua.changes, credentials.Change{User: u.Name, Mechanism: m,
			Cred: credentials.FromSaltedPassword(m, u.Salt, u.SaltedPassword, int(u.Iterations))})
	}
	authorized := rc.authorized(OpAlter, ResCluster, clusterResource)
	store := rc.s.deps.Credentials
	for _, user := range order {
		ua := byUser[user]
		for _, n := range seen[user] {
			if n > 1 {
				ua.code, ua.msg = codec.CodeDuplicateResource, "A user credential cannot be altered twice in the same request."
			}
		}
		switch {
		case !authorized:
			ua.code, ua.msg = codec.CodeClusterAuthorizationFailed, ""
		case ua.code != codec.CodeNone:
		case store == nil:
			ua.code = codec.CodeSecurityDisabled
		default:
			if err := store.Apply(ua.changes); err != nil {
				if errors.Is(err, credentials.ErrNotFound) {
					ua.code, ua.msg = codec.CodeResourceNotFound, "Attempt to delete a user credential that does not exist."
				} else {
					mCredentialStoreErrors.Inc()
					rc.s.log.Error("cannot store SCRAM credentials", zap.Error(err))
					ua.code, ua.msg = codec.CodeUnknownServerError, "Cannot store SCRAM credentials."
				}
			}
		}
		r := kmsg.NewAlterUserSCRAMCredentialsResponseResult()
		r.User, r.ErrorCode = user, ua.code
		if ua.msg != "" {
			msg := ua.msg
			r.ErrorMessage = &msg
		}
		resp.Results = append(resp.Results, r)
	}
	return resp, nil
}

func hashLen(m credentials.Mechanism) int {
	if m == credentials.SHA512 {
		return 64
	}
	return 32
}
