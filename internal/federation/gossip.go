package federation

import (
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/hashicorp/memberlist"
)

// Gossip encryption of a serf pool (LAN or WAN). With a keyring, memberlist
// encrypts and authenticates every gossip packet and push/pull stream with
// AES-GCM under the keyring's primary key and accepts any of its keys;
// a member that holds none of them cannot join, and its packets (joins,
// tags, queries) are dropped. Rotation is serf's: KeyManager's install,
// use and remove queries reach every member of the pool, which rewrites its
// keyring file (Gossip.KeyringFile) after each change.

// GossipKeyLen is the length of a key `apiary keygen` makes: AES-256.
const GossipKeyLen = 32

// GenerateGossipKey returns a new random GossipKeyLen-byte key in standard
// base64 (44 characters), the form --gossip-key and `apiary keyring` take
// (as `consul keygen` makes). It fails only when the system's random source
// does.
func GenerateGossipKey() (string, error) {
	b := make([]byte, GossipKeyLen)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("reading random bytes: %w", err)
	}
	return base64.StdEncoding.EncodeToString(b), nil
}

// DecodeGossipKey decodes a key in standard base64 (surrounding spaces are
// ignored) and checks its length: 16, 24 or 32 bytes (AES-128, -192, -256).
// A key whose bytes are all the same ("AAAAAAAAAAAAAAAAAAAAAA==", 16 zero
// bytes) is a placeholder copied from an example, not a key, and is
// refused too. The error does not repeat the key.
func DecodeGossipKey(s string) ([]byte, error) {
	b, err := base64.StdEncoding.DecodeString(strings.TrimSpace(s))
	if err != nil {
		return nil, errors.New("not standard base64 (make a key with `apiary keygen`)")
	}
	if err := memberlist.ValidateKey(b); err != nil {
		return nil, fmt.Errorf("a key must be 16, 24 or 32 bytes, this one is %d (make one with `apiary keygen`)", len(b))
	}
	if bytes.Count(b, b[:1]) == len(b) {
		return nil, fmt.Errorf("every byte of the key is 0x%02x: a placeholder, not a key (make one with `apiary keygen`)", b[0])
	}
	return b, nil
}

// Gossip is a pool member's encryption: a key to start from and the file
// serf keeps the keyring in. The zero value gossips in plain text.
type Gossip struct {
	// Key is the primary key when the keyring starts without a file (16,
	// 24 or 32 bytes); nil: none.
	Key []byte
	// KeyringFile is where serf keeps the member's keyring: a JSON list of
	// base64 keys, the primary first, mode 0600. When it exists at start it
	// is loaded and Key is not used (it holds what rotations left; a Key
	// that is not in it is reported by Load's note); when it does not and
	// Key is set, it is written with Key alone (directory made 0700). serf
	// rewrites it after every install, use and remove, so a rotation
	// survives a restart. "": no file (a rotation lasts until the process
	// ends). Each serf member needs a file of its own.
	KeyringFile string
}

// Load returns the member's keyring (nil: plain text) and a note for the
// log: where the keys came from, or that Key was ignored because the
// keyring file holds other keys. Errors name the field (gossip-key,
// gossip-keyring-file) and never repeat a key.
func (g Gossip) Load() (kr *memberlist.Keyring, note string, err error) {
	if g.Key != nil {
		if err := memberlist.ValidateKey(g.Key); err != nil {
			return nil, "", fmt.Errorf("gossip-key: a key must be 16, 24 or 32 bytes, this one is %d", len(g.Key))
		}
	}
	if g.KeyringFile != "" {
		keys, err := readKeyringFile(g.KeyringFile)
		switch {
		case err == nil:
			kr, err := memberlist.NewKeyring(keys, keys[0])
			if err != nil {
				return nil, "", fmt.Errorf("gossip-keyring-file: %s: %v", g.KeyringFile, err)
			}
			note = fmt.Sprintf("keyring loaded from %s (%d keys)", g.KeyringFile, len(keys))
			if g.Key != nil && !hasKey(keys, g.Key) {
				note += "; the given gossip key is not in it and is ignored: the file holds what the last rotation left " +
					"(remove the file to start again from the key)"
			}
			return kr, note, nil
		case !errors.Is(err, fs.ErrNotExist):
			return nil, "", err
		}
	}
	if g.Key == nil {
		return nil, "plain text (no gossip key)", nil
	}
	kr, err = memberlist.NewKeyring(nil, g.Key)
	if err != nil {
		return nil, "", fmt.Errorf("gossip-key: %v", err)
	}
	if g.KeyringFile == "" {
		return kr, "keyring of the given key (not kept in a file: a rotation lasts until the process ends)", nil
	}
	if err := writeKeyringFile(g.KeyringFile, [][]byte{g.Key}); err != nil {
		return nil, "", err
	}
	return kr, fmt.Sprintf("keyring of the given key, kept in %s", g.KeyringFile), nil
}

// readKeyringFile reads serf's keyring file format: a JSON list of
// base64 keys, the primary first. A missing file is fs.ErrNotExist
// (wrapped); an empty list, a bad key or bad JSON is an error naming the
// file.
func readKeyringFile(path string) ([][]byte, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, err
		}
		return nil, fmt.Errorf("gossip-keyring-file: %w", err)
	}
	var enc []string
	if err := json.Unmarshal(data, &enc); err != nil {
		return nil, fmt.Errorf("gossip-keyring-file: %s: not a keyring (a JSON list of base64 keys): %v", path, err)
	}
	if len(enc) == 0 {
		return nil, fmt.Errorf("gossip-keyring-file: %s: holds no key (remove it, or write the key list in it)", path)
	}
	keys := make([][]byte, 0, len(enc))
	for i, e := range enc {
		k, err := DecodeGossipKey(e)
		if err != nil {
			return nil, fmt.Errorf("gossip-keyring-file: %s: key %d: %v", path, i+1, err)
		}
		keys = append(keys, k)
	}
	return keys, nil
}

// writeKeyringFile writes keys in serf's format (mode 0600; the directory
// is made 0700 if missing), through a temporary file and a rename.
func writeKeyringFile(path string, keys [][]byte) error {
	enc := make([]string, len(keys))
	for i, k := range keys {
		enc[i] = base64.StdEncoding.EncodeToString(k)
	}
	data, err := json.MarshalIndent(enc, "", "  ")
	if err != nil {
		return fmt.Errorf("gossip-keyring-file: %v", err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fmt.Errorf("gossip-keyring-file: %w", err)
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return fmt.Errorf("gossip-keyring-file: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("gossip-keyring-file: %w", err)
	}
	return nil
}

func hasKey(keys [][]byte, k []byte) bool {
	for _, x := range keys {
		if string(x) == string(k) {
			return true
		}
	}
	return false
}
