// Package ids generates identifiers: job ids that carry their region and sort
// by submission time. It must not know anything about jobs beyond their ids.
package ids

import (
	"crypto/rand"
	"encoding/base32"
	"encoding/binary"
	"fmt"
	"math/big"
	"regexp"
	"strings"
	"time"
)

// Idempotency is the rule for a submission's client_id and request_id: 1 to
// 128 letters, digits and ._:@- (checked by the region and by the CLI).
var Idempotency = regexp.MustCompile(`^[A-Za-z0-9._:@-]{1,128}$`)

var enc = base32.NewEncoding("0123456789abcdefghjkmnpqrstvwxyz").WithPadding(base32.NoPadding)

// NewJobID returns "<region>-<20 chars>": 48 bits of Unix milliseconds then
// 72 random bits, Crockford base32 (lower case), so ids sort by time and the
// region prefix routes Get/Cancel without a lookup.
func NewJobID(region string, now time.Time) string {
	var b [15]byte
	binary.BigEndian.PutUint64(b[:8], uint64(now.UnixMilli())<<16)
	if _, err := rand.Read(b[6:]); err != nil {
		panic(err) // crypto/rand never fails on Linux
	}
	return region + "-" + enc.EncodeToString(b[:])[:20]
}

// RegionOf returns the region prefix of a job id made by NewJobID, or "" if
// the id has no such shape.
func RegionOf(jobID string) string {
	i := strings.LastIndexByte(jobID, '-')
	if i <= 0 || len(jobID)-i-1 != 20 {
		return ""
	}
	return jobID[:i]
}

// alphabet is enc's: Crockford base32, lower case.
const alphabet = "0123456789abcdefghjkmnpqrstvwxyz"

// TimeOf returns the Unix milliseconds a job id made by NewJobID carries
// (its first 48 bits); ok is false for an id of another shape.
func TimeOf(jobID string) (ms int64, ok bool) {
	if !IsJobID(jobID) {
		return 0, false
	}
	b, err := enc.DecodeString(jobID[len(RegionOf(jobID))+1:][:16]) // 80 bits
	if err != nil {
		return 0, false
	}
	return int64(binary.BigEndian.Uint64(append(make([]byte, 2), b[:6]...))), true
}

// Floor returns the id-shaped string "<region>-<20 chars>" that sorts at
// or below every id NewJobID makes for region at or after ms (Unix
// milliseconds, clamped to 0..2^48-1) and above every id it makes before
// ms: the time with the random bits all zero. It is a valid page token
// (IsJobID) that names no job (but with a chance of 2^-52).
func Floor(region string, ms int64) string {
	ms = min(max(ms, 0), 1<<48-1)
	var b [15]byte
	binary.BigEndian.PutUint64(b[:8], uint64(ms)<<16)
	return region + "-" + enc.EncodeToString(b[:])[:20]
}

// Between returns an id-shaped string m with a < m < b, for two ids of one
// region (IsJobID, same RegionOf) with a < b, about halfway between them
// in the order of their 100 bits; ok is false when a and b are of other
// shapes or adjacent (no string of that shape lies between). It lets a
// reader split a range of job ids finer than a millisecond.
func Between(a, b string) (m string, ok bool) {
	r := RegionOf(a)
	if !IsJobID(a) || !IsJobID(b) || RegionOf(b) != r || a >= b {
		return "", false
	}
	num := func(id string) *big.Int {
		n := new(big.Int)
		for _, ch := range id[len(r)+1:] {
			n.Lsh(n, 5).Or(n, big.NewInt(int64(strings.IndexRune(alphabet, ch))))
		}
		return n
	}
	x, y := num(a), num(b)
	mid := new(big.Int).Add(x, y)
	mid.Rsh(mid, 1)
	if mid.Cmp(x) == 0 {
		return "", false
	}
	out := make([]byte, 20)
	mask := big.NewInt(31) // one base32 digit
	for i := 19; i >= 0; i-- {
		out[i] = alphabet[new(big.Int).And(mid, mask).Int64()]
		mid.Rsh(mid, 5)
	}
	return r + "-" + string(out), true
}

// IsJobID reports whether s has the shape NewJobID makes: a region name
// (Region), '-', and 20 characters of its base32 alphabet. It says nothing
// of whether such a job exists.
func IsJobID(s string) bool {
	r := RegionOf(s)
	if r == "" || !Region.MatchString(r) {
		return false
	}
	for _, ch := range s[len(r)+1:] {
		if !strings.ContainsRune(alphabet, ch) {
			return false
		}
	}
	return true
}

// CheckPageToken is the rule for a ListJobs page token, which the region
// and the router both apply: empty (the first page) or a job id's shape
// (IsJobID); the error names the field and quotes at most 64 bytes of the
// token.
func CheckPageToken(tok string) error {
	if tok == "" || IsJobID(tok) {
		return nil
	}
	if len(tok) > 64 {
		tok = tok[:64] + "..."
	}
	return fmt.Errorf("page_token: must be a previous answer's next_page_token (a job id, <region>-<20 chars>), got %q", tok)
}

// Region is the rule for a region name: 1 to 63 lower-case letters, digits
// and '-', starting and ending with a letter or digit.
var Region = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

// ErrorDomain is the ErrorInfo domain of Apiary's machine-readable errors.
const ErrorDomain = "apiary.dev"

// ReasonRequestForwarded is the ErrorInfo reason a region gives when an
// idempotent request it is home to was forwarded to another region; the
// metadata key "region" names that region.
const ReasonRequestForwarded = "REQUEST_FORWARDED"
