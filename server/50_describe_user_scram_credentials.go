package server

// DescribeUserScramCredentials (KIP-554): which SCRAM mechanisms, at which iteration counts, each
// user has. Salts and keys never leave the broker. Apache's checks, in order: DESCRIBE on the
// cluster (else 31 for the whole request), a user named twice → DUPLICATE_RESOURCE for it, a
// user without credentials → RESOURCE_NOT_FOUND; no users named = every user.

import (
	"sort"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kaas-go/kaas/codec"
)

func init() {
	register(kmsg.DescribeUserSCRAMCredentials, 0, 0, handleDescribeUserSCRAMCredentials)
}

func handleDescribeUserSCRAMCredentials(rc *reqCtx) (kmsg.Response, error) {
	req := rc.req.(*kmsg.DescribeUserSCRAMCredentialsRequest)
	resp := req.ResponseKind().(*kmsg.DescribeUserSCRAMCredentialsResponse)
	if !rc.authorized(OpDescribe, ResCluster, clusterResource) {
		resp.ErrorCode = codec.CodeClusterAuthorizationFailed
		return resp, nil
	}
	store := rc.s.deps.Credentials
	if store == nil {
		resp.ErrorCode = codec.CodeSecurityDisabled
		return resp, nil
	}
	users, err := store.Users()
	if err != nil {
		mCredentialStoreErrors.Inc()
		msg := "Cannot read SCRAM credentials."
		resp.ErrorCode, resp.ErrorMessage = codec.CodeUnknownServerError, &msg
		return resp, nil
	}
	result := func(name string) kmsg.DescribeUserSCRAMCredentialsResponseResult {
		r := kmsg.NewDescribeUserSCRAMCredentialsResponseResult()
		r.User = name
		for _, c := range users[name] {
			ci := kmsg.NewDescribeUserSCRAMCredentialsResponseResultCredentialInfo()
			ci.Mechanism, ci.Iterations = int8(c.Mechanism), int32(c.Iterations)
			r.CredentialInfos = append(r.CredentialInfos, ci)
		}
		return r
	}
	if len(req.Users) == 0 {
		names := make([]string, 0, len(users))
		for u := range users {
			names = append(names, u)
		}
		sort.Strings(names)
		for _, u := range names {
			resp.Results = append(resp.Results, result(u))
		}
		return resp, nil
	}
	count := map[string]int{}
	for _, u := range req.Users {
		count[u.Name]++
	}
	seen := map[string]bool{}
	for _, u := range req.Users {
		if seen[u.Name] {
			continue
		}
		seen[u.Name] = true
		r := result(u.Name)
		switch {
		case count[u.Name] > 1:
			msg := "Cannot describe SCRAM credentials for the same user twice in a single request: " + u.Name
			r.ErrorCode, r.ErrorMessage, r.CredentialInfos = codec.CodeDuplicateResource, &msg, nil
		case len(users[u.Name]) == 0:
			msg := "Attempt to describe nonexistent user: " + u.Name
			r.ErrorCode, r.ErrorMessage = codec.CodeResourceNotFound, &msg
		}
		resp.Results = append(resp.Results, r)
	}
	return resp, nil
}
