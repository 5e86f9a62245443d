package jobspec

import (
	"crypto/sha256"
	"encoding/hex"

	"google.golang.org/protobuf/proto"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
)

// PayloadHash is a stable hash of spec: the hex SHA-256 of its deterministic
// protobuf encoding (map entries sorted). A region stores it with the dedup
// key (client_id, request_id) and compares it on a repeat: same hash, same
// job; another hash, ALREADY_EXISTS.
//
// It hashes spec exactly as given, so a caller must always hash at the same
// point of its pipeline. Hashing after ApplyDefaults makes an omitted field and
// its explicit default hash alike; the CLI sends specs already defaulted. Deterministic encoding is stable
// for one build of the API; a change to apiary.proto may change hashes, which
// only matters for dedup entries written by an older build. It returns "" for
// a spec that cannot be encoded (invalid UTF-8; Validate rejects those).
//
// Secret values are not hashed: the hash covers every secret_env name with
// an empty value. The hash is stored in etcd (the dedup record, the job
// record) and sent between routers and regions (LookupRequest), so a hash
// over the values would let anyone who reads it test guesses of a secret
// offline, at SHA-256 speed. Neither a salt (it would be stored beside the
// hash) nor an HMAC under the region's keyring (a router cannot compute it,
// regions hold different keyrings, and every hash would change at `apiary
// keyring use`, turning a client's retry into ALREADY_EXISTS) fixes that.
// So the region that holds the job compares the values themselves: on a
// repeat whose hash matches it opens the job's sealed secret_env and
// compares it with the request's (regional, sameSecrets); another value
// is ALREADY_EXISTS, as another payload is. A spec without secret_env
// hashes as it always did.
func PayloadHash(spec *apiaryv1.JobSpec) string {
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(withoutSecretValues(spec))
	if err != nil {
		// Marshal fails only on invalid UTF-8 in a string field, which
		// Validate rejects (and gRPC never delivers).
		return ""
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}
