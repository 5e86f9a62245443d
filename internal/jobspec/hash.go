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
func PayloadHash(spec *apiaryv1.JobSpec) string {
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(spec)
	if err != nil {
		// Marshal fails only on invalid UTF-8 in a string field, which
		// Validate rejects (and gRPC never delivers).
		return ""
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}
