package regional

import (
	"encoding/base64"
	"errors"
	"testing"

	apiaryv1 "apiary.dev/apiary/api/apiary/v1"
	"apiary.dev/apiary/internal/secretbox"
	"apiary.dev/apiary/regional/store"
)

// TestSealedSpecs: a spec sealed for one job opens for that job and group
// only; the input spec is not changed; re-sealing moves exactly the values
// under the old key to the primary, and the key id is the fingerprint
// `apiary keyring` logs.
func TestSealedSpecs(t *testing.T) {
	oldK, newK := []byte("0123456789abcdef0123456789abcdef"), []byte("fedcba9876543210fedcba9876543210")
	if KeyFingerprint(base64.StdEncoding.EncodeToString(oldK)) != secretbox.KeyID(oldK) {
		t.Fatal("secretbox.KeyID differs from KeyFingerprint")
	}
	plain := &apiaryv1.JobSpec{Name: "s", Tasks: []*apiaryv1.TaskGroup{
		{Command: "sh", SecretEnv: map[string]string{"A": "a-secret", "B": "b-secret"}},
		{Command: "sh", SecretEnv: map[string]string{"A": "other"}},
	}}
	sealed, err := sealSpec(plain, "j1", oldK)
	if err != nil {
		t.Fatal(err)
	}
	if plain.GetTasks()[0].GetSecretEnv()["A"] != "a-secret" {
		t.Fatal("sealSpec changed its input")
	}
	rec := &store.JobRecord{ID: "j1", Spec: sealed}
	got, err := openGroupSecrets(rec, 0, [][]byte{newK, oldK})
	if err != nil || got["A"] != "a-secret" || got["B"] != "b-secret" || len(got) != 2 {
		t.Fatalf("open group 0: %v, %v", got, err)
	}
	// A value moved to another job, group or name does not open.
	for _, moved := range []*store.JobRecord{{ID: "j2", Spec: sealed}, {ID: "j1", Spec: &apiaryv1.JobSpec{Tasks: []*apiaryv1.TaskGroup{
		{SecretEnv: map[string]string{"A": sealed.GetTasks()[1].GetSecretEnv()["A"]}}}}},
		{ID: "j1", Spec: &apiaryv1.JobSpec{Tasks: []*apiaryv1.TaskGroup{{SecretEnv: map[string]string{"C": sealed.GetTasks()[0].GetSecretEnv()["A"]}}}}}} {
		if _, err := openGroupSecrets(moved, 0, [][]byte{oldK}); !errors.Is(err, secretbox.ErrAuth) {
			t.Fatalf("a moved value opened: %v", err)
		}
	}
	if _, err := openGroupSecrets(rec, 0, [][]byte{newK}); !errors.Is(err, secretbox.ErrUnknownKey) {
		t.Fatalf("open without its key: %v", err)
	}
	if _, err := openGroupSecrets(rec, 2, [][]byte{oldK}); err == nil {
		t.Fatal("opened a group the job does not have")
	}
	// Group 1's value is under the new key already: only group 0's move.
	rec.Spec.Tasks[1].SecretEnv["A"], _ = secretbox.Seal(newK, []byte("other"), secretAAD("j1", 1, "A"))
	k := sealKeys{primary: newK, all: [][]byte{newK, oldK}}
	if !usesKey(rec, secretbox.KeyID(oldK)) {
		t.Fatal("usesKey = false")
	}
	out, n, err := resealRecord(rec, secretbox.KeyID(oldK), k)
	if err != nil || n != 2 || usesKey(out, secretbox.KeyID(oldK)) || !usesKey(rec, secretbox.KeyID(oldK)) {
		t.Fatalf("reseal: %d values, %v (old record still uses the key: %v)", n, err, usesKey(rec, secretbox.KeyID(oldK)))
	}
	if out.Spec.GetTasks()[1].GetSecretEnv()["A"] != rec.Spec.GetTasks()[1].GetSecretEnv()["A"] {
		t.Fatal("a value under the new key was rewritten")
	}
	for g, want := range []map[string]string{{"A": "a-secret", "B": "b-secret"}, {"A": "other"}} {
		got, err := openGroupSecrets(out, g, [][]byte{newK})
		if err != nil || len(got) != len(want) || got["A"] != want["A"] || got["B"] != want["B"] {
			t.Fatalf("group %d after re-sealing, new key only: %v, %v", g, got, err)
		}
	}
	if same, n, err := resealRecord(out, secretbox.KeyID(oldK), k); err != nil || n != 0 || same != out {
		t.Fatalf("re-sealing again: %d values, %v", n, err)
	}
}
