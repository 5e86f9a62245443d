package federation

import (
	"bytes"
	"encoding/base64"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestGossipKeys(t *testing.T) {
	a, err := GenerateGossipKey()
	if err != nil {
		t.Fatal(err)
	}
	b, _ := GenerateGossipKey()
	if a == b || len(a) != 44 {
		t.Fatalf("keys %q %q: want two different 44-character keys", a, b)
	}
	if k, err := DecodeGossipKey(" " + a + "\n"); err != nil || len(k) != GossipKeyLen {
		t.Fatalf("decode: %d bytes, %v", len(k), err)
	}
	for _, bad := range []string{"", "not base64!", base64.StdEncoding.EncodeToString(make([]byte, 20)), "REPLACE-with-apiary-keygen"} {
		if _, err := DecodeGossipKey(bad); err == nil || !strings.Contains(err.Error(), "apiary keygen") {
			t.Errorf("%q: %v; want an error saying how to make a key", bad, err)
		}
	}
	for _, n := range []int{16, 24, 32} {
		k := make([]byte, n)
		k[n-1] = 1
		if _, err := DecodeGossipKey(base64.StdEncoding.EncodeToString(k)); err != nil {
			t.Errorf("%d bytes: %v", n, err)
		}
		// A placeholder: every byte the same (the zero key of an example).
		for _, fill := range []byte{0, 'x'} {
			_, err := DecodeGossipKey(base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{fill}, n)))
			if err == nil || !strings.Contains(err.Error(), "placeholder") || !strings.Contains(err.Error(), "apiary keygen") {
				t.Errorf("%d bytes of 0x%02x: %v; want the placeholder refused", n, fill, err)
			}
		}
	}
}

// TestGossipLoad: no key and no file is plain text; a key with a missing
// file writes the file (0600, the key alone); an existing file wins over
// the key, and the note says the key was ignored; bad files fail naming
// the flag, never quoting a key.
func TestGossipLoad(t *testing.T) {
	if kr, _, err := (Gossip{KeyringFile: filepath.Join(t.TempDir(), "none")}).Load(); kr != nil || err != nil {
		t.Fatalf("no key, no file: %v %v", kr, err)
	}
	ks, _ := GenerateGossipKey()
	k, _ := DecodeGossipKey(ks)
	f := filepath.Join(t.TempDir(), "sub", "lan.keyring")
	kr, _, err := Gossip{Key: k, KeyringFile: f}.Load()
	if err != nil || kr == nil || string(kr.GetPrimaryKey()) != string(k) {
		t.Fatalf("key with a new file: %v", err)
	}
	st, err := os.Stat(f)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("keyring file: %v %v", st, err)
	}
	if data, _ := os.ReadFile(f); !strings.Contains(string(data), ks) {
		t.Fatalf("keyring file %q lacks the key", data)
	}

	other, _ := GenerateGossipKey()
	ok, _ := DecodeGossipKey(other)
	kr, note, err := Gossip{Key: ok, KeyringFile: f}.Load()
	if err != nil || string(kr.GetPrimaryKey()) != string(k) || len(kr.GetKeys()) != 1 || !strings.Contains(note, "ignored") {
		t.Fatalf("existing file with another key: %v, note %q", err, note)
	}
	if kr, _, err := (Gossip{KeyringFile: f}).Load(); err != nil || string(kr.GetPrimaryKey()) != string(k) {
		t.Fatalf("file alone: %v", err)
	}

	dir := t.TempDir()
	for name, content := range map[string]string{"json": "{", "empty": "[]", "short": `["` + base64.StdEncoding.EncodeToString([]byte("short")) + `"]`} {
		p := filepath.Join(dir, name)
		os.WriteFile(p, []byte(content), 0o600)
		if _, _, err := (Gossip{Key: k, KeyringFile: p}).Load(); err == nil || !strings.HasPrefix(err.Error(), "gossip-keyring-file:") ||
			strings.Contains(err.Error(), ks) {
			t.Errorf("%s: %v", name, err)
		}
	}
	if _, _, err := (Gossip{Key: []byte("short")}).Load(); err == nil || !strings.HasPrefix(err.Error(), "gossip-key:") {
		t.Errorf("short key: %v", err)
	}
}
