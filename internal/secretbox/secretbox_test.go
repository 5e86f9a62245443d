package secretbox_test

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"strings"
	"testing"

	"apiary.dev/apiary/internal/secretbox"
)

func key(t *testing.T, n int) []byte {
	t.Helper()
	k := make([]byte, n)
	if _, err := rand.Read(k); err != nil {
		t.Fatal(err)
	}
	return k
}

// TestRoundTrip: every gossip key size seals and opens, with the key among
// others in the keyring; the value is printable, carries the key id, never
// the plaintext, and two seals of one value differ (fresh nonces).
func TestRoundTrip(t *testing.T) {
	for _, n := range []int{16, 24, 32} {
		k, other := key(t, n), key(t, 32)
		aad := []byte("job=j1 group=0 name=DB_PASSWORD")
		s1, err := secretbox.Seal(k, []byte("s3cret"), aad)
		if err != nil {
			t.Fatal(err)
		}
		s2, _ := secretbox.Seal(k, []byte("s3cret"), aad)
		if s1 == s2 {
			t.Fatalf("two seals of the same value are equal: %s", s1)
		}
		if !strings.HasPrefix(s1, secretbox.Prefix+secretbox.KeyID(k)+":") || strings.Contains(s1, "s3cret") {
			t.Fatalf("sealed value %q: want the prefix and key id, and no plaintext", s1)
		}
		if id, ok := secretbox.KeyIDOf(s1); !ok || id != secretbox.KeyID(k) {
			t.Fatalf("KeyIDOf = %q, %v", id, ok)
		}
		got, err := secretbox.Open([][]byte{other, k}, s1, aad)
		if err != nil || string(got) != "s3cret" {
			t.Fatalf("%d-byte key: Open = %q, %v", n, got, err)
		}
	}
	// The empty value seals too.
	k := key(t, 32)
	s, err := secretbox.Seal(k, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := secretbox.Open([][]byte{k}, s, nil); err != nil || len(got) != 0 {
		t.Fatalf("empty value: %q, %v", got, err)
	}
}

// TestKeyIDIsTheKeyringFingerprint: the id is the first 8 hex digits of the
// SHA-256 of the key's base64 form, stable and distinct per key.
func TestKeyIDIsTheKeyringFingerprint(t *testing.T) {
	k := []byte("0123456789abcdef0123456789abcdef")
	sum := sha256.Sum256([]byte(base64.StdEncoding.EncodeToString(k)))
	if got, want := secretbox.KeyID(k), hex.EncodeToString(sum[:4]); got != want {
		t.Fatalf("KeyID = %q, want %q", got, want)
	}
	if secretbox.KeyID(k) == secretbox.KeyID(key(t, 32)) {
		t.Fatal("two keys share an id")
	}
}

// TestTamperedValuesDoNotOpen: a flipped bit anywhere in the body, a cut
// body, another context (aad), a key id rewritten to another key of the
// keyring, a key id no key has, and values not in the format are each
// refused with the documented error, never opened.
func TestTamperedValuesDoNotOpen(t *testing.T) {
	k, k2 := key(t, 32), key(t, 32)
	keys := [][]byte{k, k2}
	aad := []byte("job=j1 group=0 name=A")
	s, err := secretbox.Seal(k, []byte("s3cret value"), aad)
	if err != nil {
		t.Fatal(err)
	}
	id, body, ok := secretbox.Parse(s)
	if !ok {
		t.Fatal("Parse refused a sealed value")
	}
	enc := func(id string, b []byte) string {
		return secretbox.Prefix + id + ":" + base64.RawURLEncoding.EncodeToString(b)
	}
	for i := range body {
		b := bytes.Clone(body)
		b[i] ^= 0x01
		if _, err := secretbox.Open(keys, enc(id, b), aad); !errors.Is(err, secretbox.ErrAuth) {
			t.Fatalf("bit flipped at byte %d: %v, want ErrAuth", i, err)
		}
	}
	if _, err := secretbox.Open(keys, enc(id, body[:len(body)-1]), aad); !errors.Is(err, secretbox.ErrAuth) {
		t.Fatalf("cut body: %v", err)
	}
	if _, err := secretbox.Open(keys, enc(id, body[:5]), aad); !errors.Is(err, secretbox.ErrAuth) {
		t.Fatalf("body shorter than a nonce: %v", err)
	}
	if _, err := secretbox.Open(keys, s, []byte("job=j2 group=0 name=A")); !errors.Is(err, secretbox.ErrAuth) {
		t.Fatalf("another job's context: %v", err)
	}
	// The id of the other installed key: that key is tried and fails.
	if _, err := secretbox.Open(keys, enc(secretbox.KeyID(k2), body), aad); !errors.Is(err, secretbox.ErrAuth) {
		t.Fatalf("key id rewritten to another installed key: %v", err)
	}
	// A key id that no key has (the key was removed).
	_, err = secretbox.Open([][]byte{k2}, s, aad)
	var uk *secretbox.UnknownKeyError
	if !errors.As(err, &uk) || uk.KeyID != id || !errors.Is(err, secretbox.ErrUnknownKey) || !strings.Contains(err.Error(), id) {
		t.Fatalf("key not in the keyring: %v", err)
	}
	for _, bad := range []string{"s3cret value", secretbox.Prefix, secretbox.Prefix + "xyz:AAAA", secretbox.Prefix + id + ":!!",
		secretbox.Prefix + strings.ToUpper(id) + ":AAAA", "apiary-sealed:v2:" + id + ":AAAA"} {
		if _, err := secretbox.Open(keys, bad, aad); !errors.Is(err, secretbox.ErrNotSealed) {
			t.Fatalf("Open(%q) = %v, want ErrNotSealed", bad, err)
		}
	}
	if _, err := secretbox.Seal(nil, []byte("x"), nil); err == nil {
		t.Fatal("Seal with an empty key succeeded")
	}
}
