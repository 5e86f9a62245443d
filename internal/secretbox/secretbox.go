package secretbox

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
)

// Prefix starts every sealed value (the format's version 1).
const Prefix = "apiary-sealed:v1:"

// keyIDLen is the length of a key id in hex digits.
const keyIDLen = 8

// hkdfInfo labels the derivation of a sealing key from a keyring key.
const hkdfInfo = "apiary secretbox v1: AES-256-GCM key"

// Errors of Open. An unknown key id is an *UnknownKeyError, which
// errors.Is(err, ErrUnknownKey) recognises.
var (
	// ErrNotSealed: the value is not in the sealed format (no Prefix, a
	// malformed key id or body).
	ErrNotSealed = errors.New("secretbox: not a sealed value")
	// ErrUnknownKey: no key of the keyring has the value's key id.
	ErrUnknownKey = errors.New("secretbox: sealed under a key that is not in the keyring")
	// ErrAuth: the value did not authenticate with the key of its id: it
	// was changed, moved to another context (aad), or its key id was
	// rewritten.
	ErrAuth = errors.New("secretbox: sealed value does not authenticate (tampered, moved, or its key id rewritten)")
)

// UnknownKeyError is Open's error for a value sealed under a key the
// keyring does not hold; KeyID names that key.
type UnknownKeyError struct{ KeyID string }

func (e *UnknownKeyError) Error() string {
	return fmt.Sprintf("secretbox: sealed under key %s, which is not in the keyring (removed?)", e.KeyID)
}

// Is makes errors.Is(err, ErrUnknownKey) true.
func (e *UnknownKeyError) Is(target error) bool { return target == ErrUnknownKey }

// KeyID is key's short public name: the first 8 hex digits of the SHA-256
// of its standard base64 form (regional.KeyFingerprint's value). It reveals
// nothing usable about a random key of 16 bytes or more.
func KeyID(key []byte) string {
	sum := sha256.Sum256([]byte(base64.StdEncoding.EncodeToString(key)))
	return hex.EncodeToString(sum[:])[:keyIDLen]
}

// aead derives key's AES-256-GCM cipher (HKDF-SHA256, no salt, hkdfInfo).
func aead(key []byte) (cipher.AEAD, error) {
	if len(key) == 0 {
		return nil, errors.New("secretbox: empty key")
	}
	k, err := hkdf.Key(sha256.New, key, nil, hkdfInfo, 32)
	if err != nil {
		return nil, err
	}
	b, err := aes.NewCipher(k)
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(b)
}

// additional is the authenticated data of a value: the format, the key id
// and the caller's context.
func additional(id string, aad []byte) []byte {
	return append([]byte(Prefix+id+":"), aad...)
}

// Seal encrypts plaintext under key (any length; a serf gossip key is 16, 24
// or 32 bytes) with a fresh random nonce, binding aad, and returns the
// sealed string (about 4/3 of len(plaintext) + 63 bytes). Its only error is
// an empty key or a failing system random source.
func Seal(key, plaintext, aad []byte) (string, error) {
	g, err := aead(key)
	if err != nil {
		return "", err
	}
	id := KeyID(key)
	nonce := make([]byte, g.NonceSize(), g.NonceSize()+len(plaintext)+g.Overhead())
	if _, err := rand.Read(nonce); err != nil {
		return "", fmt.Errorf("secretbox: nonce: %w", err)
	}
	box := g.Seal(nonce, nonce, plaintext, additional(id, aad))
	return Prefix + id + ":" + base64.RawURLEncoding.EncodeToString(box), nil
}

// Parse splits a sealed value into its key id and sealed body; ok is false
// when s is not in the sealed format.
func Parse(s string) (keyID string, body []byte, ok bool) {
	rest, found := strings.CutPrefix(s, Prefix)
	if !found {
		return "", nil, false
	}
	id, enc, found := strings.Cut(rest, ":")
	if !found || len(id) != keyIDLen || strings.Trim(id, "0123456789abcdef") != "" {
		return "", nil, false
	}
	body, err := base64.RawURLEncoding.DecodeString(enc)
	if err != nil {
		return "", nil, false
	}
	return id, body, true
}

// KeyIDOf returns the key id of a sealed value ("" and false when s is not
// sealed).
func KeyIDOf(s string) (string, bool) {
	id, _, ok := Parse(s)
	return id, ok
}

// Open decrypts a sealed value with the key of keys whose KeyID is the
// value's, checking aad. Errors: ErrNotSealed, *UnknownKeyError (no such
// key), ErrAuth (tampered, another aad, or a rewritten key id).
func Open(keys [][]byte, sealed string, aad []byte) ([]byte, error) {
	id, body, ok := Parse(sealed)
	if !ok {
		return nil, ErrNotSealed
	}
	var tried bool
	for _, k := range keys {
		if KeyID(k) != id {
			continue
		}
		tried = true
		g, err := aead(k)
		if err != nil {
			return nil, err
		}
		if len(body) < g.NonceSize()+g.Overhead() {
			return nil, ErrAuth
		}
		pt, err := g.Open(nil, body[:g.NonceSize()], body[g.NonceSize():], additional(id, aad))
		if err == nil {
			return pt, nil
		}
		// Another key of the keyring may share the 32-bit id: try it too.
	}
	if !tried {
		return nil, &UnknownKeyError{KeyID: id}
	}
	return nil, ErrAuth
}
